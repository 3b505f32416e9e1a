package wasmrun

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/bytecodealliance/wasmtime-go/v39"
)

// BenchmarkModuleLoad is what the cache saves: compiling the Go hello module (what a
// cache miss costs every run) against deserializing its compiled form (a hit).
func BenchmarkModuleLoad(b *testing.B) {
	wasm, err := os.ReadFile(helloWasm)
	if err != nil {
		b.Fatal(err)
	}
	engine := NewEngine()
	m, err := wasmtime.NewModule(engine, wasm)
	if err != nil {
		b.Fatal(err)
	}
	cwasm, err := m.Serialize()
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("hello module: %d KiB wasm, %d KiB compiled", len(wasm)>>10, len(cwasm)>>10)
	b.Run("compile", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			m, err := wasmtime.NewModule(engine, wasm)
			if err != nil {
				b.Fatal(err)
			}
			m.Close()
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/op")
	})
	b.Run("deserialize", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			m, err := wasmtime.NewModuleDeserialize(engine, cwasm)
			if err != nil {
				b.Fatal(err)
			}
			m.Close()
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/op")
	})
}

// BenchmarkFuelOverhead is what keeping fuel consumption always on costs a CPU-bound guest
// that was given no --fuel: the Go guest's arithmetic loop on an engine with fuel checks
// (roost-wasm's) and on one without.
func BenchmarkFuelOverhead(b *testing.B) {
	wasm, err := os.ReadFile(guestWasm)
	if err != nil {
		b.Fatal(err)
	}
	for _, fuel := range []bool{true, false} {
		s := settings
		s.ConsumeFuel = fuel
		engine := newEngine(s)
		m, err := wasmtime.NewModule(engine, wasm)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("fuel=%v", fuel), func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				if err := runInProcess(engine, m, fuel, "burn", "100000000"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/op")
		})
		m.Close()
	}
}

// runInProcess runs the guest's _start with args, its output discarded.
func runInProcess(engine *wasmtime.Engine, m *wasmtime.Module, fuel bool, args ...string) error {
	store := wasmtime.NewStore(engine)
	defer store.Close()
	if fuel {
		if err := store.SetFuel(1 << 62); err != nil {
			return err
		}
	}
	store.SetEpochDeadline(1)
	wasi := wasmtime.NewWasiConfig()
	wasi.SetArgv(append([]string{"guest.wasm"}, args...))
	if err := wasi.SetStdoutFile(os.DevNull); err != nil {
		return err
	}
	store.SetWasi(wasi)
	linker := wasmtime.NewLinker(engine)
	defer linker.Close()
	if err := linker.DefineWasi(); err != nil {
		return err
	}
	inst, err := linker.Instantiate(store, m)
	if err != nil {
		return err
	}
	_, err = inst.GetFunc(store, "_start").Call(store)
	var werr *wasmtime.Error
	if errors.As(err, &werr) {
		if status, ok := werr.ExitStatus(); ok && status == 0 {
			return nil
		}
	}
	return err
}
