package cli

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// fileChunk is what one WriteFile or UploadTree message carries: well within roostd's
// control.max_recv_message_bytes.
const fileChunk = 256 << 10

func (a *app) files() (roostv1.FilesServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return roostv1.NewFilesServiceClient(conn), nil
}

// sessionPath splits SESSION:PATH; ok is false for a local path (one holding no colon
// before its first slash, or starting with . or /).
func sessionPath(arg string) (session, p string, ok bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", "", false
	}
	s, p, ok := strings.Cut(arg, ":")
	if !ok || s == "" || strings.Contains(s, "/") {
		return "", "", false
	}
	return s, p, true
}

func (a *app) cpCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cp SESSION:PATH LOCAL | cp LOCAL SESSION:PATH",
		Short: "Copy files out of a session's workdir, or into it",
		Long: `cp copies between this machine and a session's workdir, as docker cp does: PATH is
relative to the workdir, and a directory is copied with everything in it.

Out of a session: a directory is made at LOCAL, or put inside LOCAL when LOCAL is a
directory already; a file likewise. LOCAL - writes a tar archive to stdout. Symlinks are
copied as links; FIFOs, sockets and devices are left out. cp reads a live session and an
ended one alike.

Into a live or staged session: the files become the session's, owned by its uid; a
file is replaced whole (written aside, then renamed), never written through a symlink.
LOCAL - reads a tar archive from stdin into the directory PATH. Writes that would take the
session past resources.workdir_max_bytes or workdir_max_inodes are refused. An ended
session's workdir is read-only.

See docs/files.md for what roostd refuses in a workdir and why.`,
		Example: `  roostctl cp web:out/report.txt .
  roostctl cp web:src ./src-copy
  roostctl cp ./data web:input
  tar -C dir -c . | roostctl cp - web:unpacked`,
		Args: exactArgs(2, "a SESSION:PATH and a LOCAL path, in either order"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if s, p, ok := sessionPath(args[0]); ok {
				if _, _, both := sessionPath(args[1]); both {
					return usageError{fmt.Errorf("cp copies between this machine and a session, not between two sessions: %s and %s", args[0], args[1])}
				}
				return a.copyOut(cmd, s, p, args[1])
			}
			if s, p, ok := sessionPath(args[1]); ok {
				return a.copyIn(cmd, args[0], s, p)
			}
			return usageError{fmt.Errorf("cp takes one SESSION:PATH: neither %s nor %s names a session", args[0], args[1])}
		},
	}
	return cmd
}

// copyOut downloads the session's entry at p to local.
func (a *app) copyOut(cmd *cobra.Command, session, p, local string) error {
	c, err := a.files()
	if err != nil {
		return err
	}
	st, err := c.StatFile(cmd.Context(), &roostv1.StatFileRequest{Session: session, Path: p})
	if err != nil {
		return err
	}
	stream, err := c.DownloadTree(cmd.Context(), &roostv1.DownloadTreeRequest{Session: session, Path: p})
	if err != nil {
		return err
	}
	r := &downloadReader{stream: stream}
	if local == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), r)
		return err
	}
	dest := local
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		dest = filepath.Join(local, path.Base(path.Clean("/"+p)))
	}
	if st.GetInfo().GetType() == roostv1.FileType_FILE_TYPE_DIRECTORY {
		if err := os.MkdirAll(dest, 0o755); err != nil {
			return err
		}
		return extractTar(r, dest, "")
	}
	// One entry, named by its base name: extracted beside dest, under dest's name.
	return extractTar(r, filepath.Dir(dest), filepath.Base(dest))
}

// downloadReader reads a DownloadTree stream's bytes.
type downloadReader struct {
	stream roostv1.FilesService_DownloadTreeClient
	buf    []byte
}

func (r *downloadReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		resp, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		r.buf = resp.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// extractTar unpacks r into dir through an os.Root, so no entry lands outside dir whatever
// it is named or links to; with as, the archive's one entry is named that.
func extractTar(r io.Reader, dir, as string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	// The directories made so far, so that each entry does not make its parents again.
	made := map[string]bool{".": true}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := h.Name
		if as != "" {
			name = as
		}
		if !filepath.IsLocal(name) {
			return fmt.Errorf("archive entry %q: not a path beneath %s", h.Name, dir)
		}
		mode := fs.FileMode(h.Mode) & 0o777
		if h.Typeflag != tar.TypeDir && h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeSymlink {
			continue
		}
		if parent := filepath.Dir(name); !made[parent] {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return err
			}
			made[parent] = true
		}
		// A later entry of a name replaces an earlier one (a tree read while it changed may
		// name an entry twice); a directory over a directory merges.
		err = extractEntry(root, tr, h, name, mode)
		if errors.Is(err, fs.ErrExist) {
			if fi, lerr := root.Lstat(name); lerr == nil && fi.IsDir() && h.Typeflag == tar.TypeDir {
				continue
			}
			if err = root.RemoveAll(name); err == nil {
				clear(made)
				made["."] = true
				err = extractEntry(root, tr, h, name, mode)
			}
		}
		if err != nil {
			return err
		}
	}
}

// extractEntry makes one directory, file or link, refusing (fs.ErrExist) to replace
// anything.
func extractEntry(root *os.Root, r io.Reader, h *tar.Header, name string, mode fs.FileMode) error {
	switch h.Typeflag {
	case tar.TypeDir:
		return root.Mkdir(name, mode|0o700)
	case tar.TypeSymlink:
		return root.Symlink(h.Linkname, name)
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyIn uploads local to the session's p: a file by WriteFile, a directory or - as tar.
func (a *app) copyIn(cmd *cobra.Command, local, session, p string) error {
	c, err := a.files()
	if err != nil {
		return err
	}
	if local == "-" {
		return upload(cmd, c, session, p, func(w io.Writer) error {
			_, err := io.Copy(w, cmd.InOrStdin())
			return err
		})
	}
	fi, err := os.Lstat(local)
	if err != nil {
		return err
	}
	// Into an existing directory, under the local name; else at p itself.
	dest := p
	st, err := c.StatFile(cmd.Context(), &roostv1.StatFileRequest{Session: session, Path: p})
	switch {
	case err == nil && st.GetInfo().GetType() == roostv1.FileType_FILE_TYPE_DIRECTORY:
		dest = path.Join(p, filepath.Base(local))
	case err != nil && status.Code(err) != codes.NotFound:
		return err
	}
	if fi.IsDir() {
		return upload(cmd, c, session, dest, func(w io.Writer) error { return packTree(w, local) })
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file or directory", local)
	}
	return writeFile(cmd, c, session, dest, local, uint32(fi.Mode().Perm()))
}

func writeFile(cmd *cobra.Command, c roostv1.FilesServiceClient, session, p, local string, mode uint32) error {
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	stream, err := c.WriteFile(cmd.Context())
	if err != nil {
		return err
	}
	if err := stream.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Header{Header: &roostv1.WriteFileHeader{Session: session, Path: p, Mode: mode}}}); err != nil {
		_, err = stream.CloseAndRecv()
		return err
	}
	buf := make([]byte, fileChunk)
	for {
		n, rerr := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Data{Data: buf[:n]}}); err != nil {
				// The server ended the stream: its reason is in CloseAndRecv.
				_, err = stream.CloseAndRecv()
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	_, err = stream.CloseAndRecv()
	return err
}

// uploadWriter sends what it is given as UploadTree data.
type uploadWriter struct {
	stream roostv1.FilesService_UploadTreeClient
}

func (w uploadWriter) Write(p []byte) (int, error) {
	for n := 0; n < len(p); n += fileChunk {
		if err := w.stream.Send(&roostv1.UploadTreeRequest{Part: &roostv1.UploadTreeRequest_Data{Data: p[n:min(len(p), n+fileChunk)]}}); err != nil {
			return n, err
		}
	}
	return len(p), nil
}

func upload(cmd *cobra.Command, c roostv1.FilesServiceClient, session, p string, produce func(io.Writer) error) error {
	stream, err := c.UploadTree(cmd.Context())
	if err != nil {
		return err
	}
	err = stream.Send(&roostv1.UploadTreeRequest{Part: &roostv1.UploadTreeRequest_Header{Header: &roostv1.UploadTreeHeader{Session: session, Path: p}}})
	if err == nil {
		// Whole chunks, not a message for each tar header and small file.
		w := bufio.NewWriterSize(uploadWriter{stream}, fileChunk)
		if err = produce(w); err == nil {
			err = w.Flush()
		}
	}
	resp, rerr := stream.CloseAndRecv()
	if rerr != nil {
		// The server's reason, whatever the sending side saw (io.EOF once it ended).
		return rerr
	}
	if err != nil {
		return err
	}
	for _, s := range resp.GetSkipped() {
		fmt.Fprintf(cmd.ErrOrStderr(), "skipped %s\n", s)
	}
	if more := resp.GetSkippedCount() - int64(len(resp.GetSkipped())); more > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "skipped %d more\n", more)
	}
	return nil
}

// packTree writes a tar archive of the local directory dir: directories, regular files and
// symlinks (as links), relative to dir.
func packTree(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func (a *app) filesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "files",
		Short: "List, read, describe, remove and make files in a session's workdir",
		Long: `files reaches into a session's workdir through roostd: ls, cat and stat read it (live or
ended), rm and mkdir change it (live or staged). PATH is relative to the workdir; a symlink
on it is never followed. roostctl cp copies whole files and trees. See docs/files.md.`,
	}
	cmd.AddCommand(a.filesLsCommand(), a.filesCatCommand(), a.filesStatCommand(), a.filesRmCommand(), a.filesMkdirCommand())
	return cmd
}

func pathArg(args []string) string {
	if len(args) > 1 {
		return args[1]
	}
	return ""
}

func typeLetter(t roostv1.FileType) string {
	switch t {
	case roostv1.FileType_FILE_TYPE_DIRECTORY:
		return "d"
	case roostv1.FileType_FILE_TYPE_SYMLINK:
		return "l"
	case roostv1.FileType_FILE_TYPE_FIFO:
		return "p"
	case roostv1.FileType_FILE_TYPE_SOCKET:
		return "s"
	case roostv1.FileType_FILE_TYPE_CHAR_DEVICE:
		return "c"
	case roostv1.FileType_FILE_TYPE_BLOCK_DEVICE:
		return "b"
	}
	return "-"
}

func (a *app) filesLsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls SESSION [PATH]",
		Short: "List a directory of a session's workdir",
		Long: `ls lists a directory of the session's workdir (the workdir itself without PATH), sorted
by name: type, mode, size, owner's uid, and name (-> a symlink's target). --json prints
a JSON array of the entries as roostd describes them.`,
		Example: `  roostctl files ls web
  roostctl files ls web src --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usageError{fmt.Errorf("ls takes a SESSION and, optionally, a PATH (got %d arguments); see roostctl files ls --help", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.files()
			if err != nil {
				return err
			}
			var all []*roostv1.FileInfo
			token := ""
			for {
				resp, err := c.ListDir(cmd.Context(), &roostv1.ListDirRequest{Session: args[0], Path: pathArg(args), PageToken: token})
				if err != nil {
					return err
				}
				all = append(all, resp.GetEntries()...)
				if token = resp.GetNextPageToken(); token == "" {
					break
				}
			}
			slices.SortFunc(all, func(x, y *roostv1.FileInfo) int { return strings.Compare(x.GetName(), y.GetName()) })
			if asJSON {
				return printJSONList(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, e := range all {
				name := e.GetName()
				if e.GetLinkTarget() != "" {
					name += " -> " + e.GetLinkTarget()
				}
				fmt.Fprintf(tw, "%s%s\t%d\t%d\t%s\n", typeLetter(e.GetType()), fs.FileMode(e.GetMode()).Perm().String()[1:], e.GetSize(), e.GetUid(), name)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func (a *app) filesCatCommand() *cobra.Command {
	var offset, length int64
	cmd := &cobra.Command{
		Use:   "cat SESSION PATH",
		Short: "Print a file of a session's workdir",
		Long: `cat writes a regular file of the session's workdir to stdout, or --length bytes of it
from --offset. A symlink, FIFO, socket or device is refused, never opened.`,
		Example: `  roostctl files cat web out/report.txt
  roostctl files cat --offset 1024 --length 64 web big.bin | xxd`,
		Args: exactArgs(2, "a SESSION and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.files()
			if err != nil {
				return err
			}
			stream, err := c.ReadFile(cmd.Context(), &roostv1.ReadFileRequest{Session: args[0], Path: args[1], Offset: offset, Length: length})
			if err != nil {
				return err
			}
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				if _, err := cmd.OutOrStdout().Write(resp.GetData()); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().Int64Var(&offset, "offset", 0, "start this many bytes in")
	cmd.Flags().Int64Var(&length, "length", 0, "print at most this many bytes (0: to the end)")
	return cmd
}

func (a *app) filesStatCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat SESSION PATH",
		Short: "Describe an entry of a session's workdir",
		Long: `stat describes one entry of the session's workdir as lstat sees it (a symlink as
itself): its type, mode, size, what it holds on disk, owner and modification time.`,
		Example: `  roostctl files stat web out/report.txt
  roostctl files stat --json web big.bin`,
		Args: exactArgs(2, "a SESSION and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.files()
			if err != nil {
				return err
			}
			resp, err := c.StatFile(cmd.Context(), &roostv1.StatFileRequest{Session: args[0], Path: args[1]})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp.GetInfo())
			}
			i := resp.GetInfo()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "name: %s\ntype: %s\nmode: %#o\nsize: %d\nallocated: %d\nowner: %d:%d\nmodified: %s\n",
				i.GetName(), strings.ToLower(strings.TrimPrefix(i.GetType().String(), "FILE_TYPE_")), i.GetMode(), i.GetSize(),
				i.GetAllocatedBytes(), i.GetUid(), i.GetGid(), i.GetModifiedAt().AsTime().Format("2006-01-02T15:04:05Z07:00"))
			if i.GetLinkTarget() != "" {
				fmt.Fprintf(out, "target: %s\n", i.GetLinkTarget())
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the entry as JSON")
	return cmd
}

func (a *app) filesRmCommand() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm SESSION PATH",
		Short: "Remove an entry of a live session's workdir",
		Long: `rm removes a file, a symlink (never what it points at) or an empty directory of the
session's workdir; -r removes a directory with everything in it.`,
		Example: `  roostctl files rm web out/old.txt
  roostctl files rm -r web build`,
		Args: exactArgs(2, "a SESSION and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.files()
			if err != nil {
				return err
			}
			_, err = c.RemoveFile(cmd.Context(), &roostv1.RemoveFileRequest{Session: args[0], Path: args[1], Recursive: recursive})
			return err
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and everything in it")
	return cmd
}

func (a *app) filesMkdirCommand() *cobra.Command {
	var parents bool
	cmd := &cobra.Command{
		Use:   "mkdir SESSION PATH",
		Short: "Make a directory in a live session's workdir",
		Long: `mkdir makes a directory in the session's workdir, owned by the session; -p makes the
missing ones above it too, and an existing directory is then no error.`,
		Example: `  roostctl files mkdir -p web input/batch1`,
		Args:    exactArgs(2, "a SESSION and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.files()
			if err != nil {
				return err
			}
			_, err = c.MakeDir(cmd.Context(), &roostv1.MakeDirRequest{Session: args[0], Path: args[1], Parents: parents})
			return err
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "make missing parent directories; an existing directory is no error")
	return cmd
}
