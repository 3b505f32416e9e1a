package wasmrun

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bytecodealliance/wasmtime-go/v39"
)

// maxModuleSize bounds what the runner reads as a module or a compiled module.
const maxModuleSize = 1 << 30

// readBounded reads a whole file of at most maxModuleSize bytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if info.Size() > maxModuleSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxModuleSize)
	}
	var buf bytes.Buffer
	buf.Grow(int(info.Size()) + 1)
	if _, err := buf.ReadFrom(f); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compileFile compiles the binary module at path.
func compileFile(engine *wasmtime.Engine, path string) (*wasmtime.Module, error) {
	wasm, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	m, err := wasmtime.NewModule(engine, wasm)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %s", path, firstLine(err.Error()))
	}
	return m, nil
}

// Compile compiles the module at modulePath and writes the compiled module (cwasm) to out
// atomically: a temporary file in out's directory, synced, mode 0644, renamed over out. It
// returns the SHA-256 of what it wrote, in hex.
func Compile(modulePath, out string) (string, error) {
	return compileWith(NewEngine(), modulePath, out)
}

func compileWith(engine *wasmtime.Engine, modulePath, out string) (string, error) {
	m, err := compileFile(engine, modulePath)
	if err != nil {
		return "", err
	}
	data, err := m.Serialize()
	if err != nil {
		return "", fmt.Errorf("serializing %s: %s", modulePath, firstLine(err.Error()))
	}
	if err := writeAtomically(out, data, 0o644); err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

func writeAtomically(path string, data []byte, mode os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// loadCached deserializes the compiled module in file, after checking that its contents
// hash to wantSHA. The bytes hashed are the bytes deserialized: the file is read once.
// wasmtime trusts a compiled module's code, so nothing unchecked is ever handed to it; it
// checks itself that the module was compiled by this wasmtime with these settings.
func loadCached(engine *wasmtime.Engine, file, wantSHA string) (*wasmtime.Module, error) {
	data, err := readBounded(file)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != strings.ToLower(wantSHA) {
		return nil, fmt.Errorf("its sha256 is %s, not %s", got, wantSHA)
	}
	m, err := wasmtime.NewModuleDeserialize(engine, data)
	if err != nil {
		return nil, fmt.Errorf("wasmtime refused it: %s", firstLine(err.Error()))
	}
	return m, nil
}

// validSHA256 reports whether s is 64 hex digits.
func validSHA256(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// loadModule is the module to run: the cached compiled one when it is usable, else the
// module compiled now (saying once on stderr why the cache was not used). cached reports
// which.
func loadModule(engine *wasmtime.Engine, opts *Options) (m *wasmtime.Module, cached bool, err error) {
	if opts.Cache != "" {
		m, err := loadCached(engine, opts.Cache, opts.CacheSHA256)
		if err == nil {
			return m, true, nil
		}
		fmt.Fprintf(opts.stderr(), "roost-wasm: cache entry %s unusable (%s); compiled from the module\n", opts.Cache, oneLine(err.Error()))
	}
	m, err = compileFile(engine, opts.Module)
	return m, false, err
}

var errNoStart = errors.New("the module exports no _start function (not a WASI command)")
