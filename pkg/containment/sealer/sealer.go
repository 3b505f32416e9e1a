// Package sealer starts sealed sessions' containers from roost-sealer, a small helper
// process roostd keeps running, instead of from roostd itself.
//
// libcontainer starts a container's init by re-executing the binary that asked for the
// container, as "<binary> init". Asked by roostd, that is a 30 MB binary whose package
// initialisation (gRPC, protobuf descriptors, Prometheus, roost's own) runs before the
// container's first mount, on every sealed start. roost-sealer links libcontainer and little
// else, so its re-execution costs a fraction of that. It also runs from a sealed memfd copy
// of itself, so libcontainer has no binary to clone per start.
//
// roostd hands roost-sealer, per start, the container's libcontainer configuration and the
// init's descriptors; roost-sealer creates and runs the container, answers with the init's
// pid, and reaps the init when it ends. Everything after the start (state, signals, exec,
// destroy) roostd does itself through libcontainer.Load: the container's state directory is
// the contract between the two, as it is between runc invocations.
package sealer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// Name is the helper's binary name; roostd looks for it next to itself.
const Name = "roost-sealer"

// Request asks for one container to be created in Root as ID and its init started.
type Request struct {
	Root   string          `json:"root"`
	ID     string          `json:"id"`
	Config *configs.Config `json:"config"`
	// The init's command line, environment and working directory in the container. Its
	// descriptors 3, 4, … are the files sent with the request, in order.
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
	// MemfdHelper, when set, is roost-init's path on the host, through which vm.memfd_noexec
	// is set to 2 in the container's pid namespace (roostinit.SetMemfdNoExecIn) once the
	// container is made and before its init runs anything of the session's.
	MemfdHelper string `json:"memfd_helper,omitempty"`
}

// Reply is the init's host pid, or why the container could not be started.
type Reply struct {
	PID   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
	// MemfdNoExec says vm.memfd_noexec was set as Request.MemfdHelper asked: a roost-sealer
	// older than the field would start the container without it.
	MemfdNoExec bool `json:"memfd_noexec,omitempty"`
	// InitStart is the init's start time as libcontainer recorded it in the container's
	// state: roostd need not read that state back to tell the init from a later process
	// of its pid.
	InitStart uint64 `json:"init_start,omitempty"`
}

// maxMessage bounds a request or reply: a configuration with a seccomp filter is tens of
// kilobytes.
const maxMessage = 16 << 20

// maxFiles bounds the descriptors a request carries.
const maxFiles = 16

// writeMessage writes v as a length-prefixed JSON message on the stream socket fd, with
// files attached to its first bytes.
func writeMessage(fd int, v any, files []*os.File) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > maxMessage {
		return fmt.Errorf("message of %d bytes is over the limit of %d", len(body), maxMessage)
	}
	if len(files) > maxFiles {
		return fmt.Errorf("%d descriptors are over the limit of %d", len(files), maxFiles)
	}
	head := make([]byte, 4)
	binary.BigEndian.PutUint32(head, uint32(len(body)))
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(fd, head, oob, nil, 0); err != nil {
		return err
	}
	for len(body) > 0 {
		n, err := unix.Write(fd, body)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}

// readMessage reads a message writeMessage wrote into v, and the files attached to it.
func readMessage(fd int, v any) ([]*os.File, error) {
	head := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(maxFiles*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(fd, head, oob, unix.MSG_CMSG_CLOEXEC)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	files, err := parseRights(oob[:oobn])
	if err != nil {
		return nil, err
	}
	fail := func(err error) ([]*os.File, error) {
		closeAll(files)
		return nil, err
	}
	if n == 0 {
		return fail(io.EOF)
	}
	r := fdReader(fd)
	if n < len(head) {
		if _, err := io.ReadFull(r, head[n:]); err != nil {
			return fail(err)
		}
	}
	size := binary.BigEndian.Uint32(head)
	if size > maxMessage {
		return fail(fmt.Errorf("message of %d bytes is over the limit of %d", size, maxMessage))
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return fail(err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fail(err)
	}
	return files, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "sent"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// fdReader reads a raw descriptor, retrying reads a signal interrupts.
type fdReader int

func (r fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), p)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}
