package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/workdir"
)

// filesService serves the files of sessions' workdirs; pkg/session and pkg/workdir hold
// every rule, this only moves bytes between them and the streams.
type filesService struct {
	roostv1.UnimplementedFilesServiceServer
	m           *session.Manager
	sendTimeout time.Duration
}

var _ roostv1.FilesServiceServer = (*filesService)(nil)

func fileType(mode uint32) roostv1.FileType {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return roostv1.FileType_FILE_TYPE_REGULAR
	case unix.S_IFDIR:
		return roostv1.FileType_FILE_TYPE_DIRECTORY
	case unix.S_IFLNK:
		return roostv1.FileType_FILE_TYPE_SYMLINK
	case unix.S_IFIFO:
		return roostv1.FileType_FILE_TYPE_FIFO
	case unix.S_IFSOCK:
		return roostv1.FileType_FILE_TYPE_SOCKET
	case unix.S_IFCHR:
		return roostv1.FileType_FILE_TYPE_CHAR_DEVICE
	case unix.S_IFBLK:
		return roostv1.FileType_FILE_TYPE_BLOCK_DEVICE
	}
	return roostv1.FileType_FILE_TYPE_UNSPECIFIED
}

func fileInfo(name string, st *unix.Stat_t, link string) *roostv1.FileInfo {
	return &roostv1.FileInfo{
		Name: name, Type: fileType(st.Mode), Size: st.Size, Mode: st.Mode & 0o7777,
		ModifiedAt: timestamppb.New(time.Unix(st.Mtim.Unix())),
		Uid:        st.Uid, Gid: st.Gid,
		AllocatedBytes: st.Blocks * 512, LinkTarget: link,
	}
}

func baseName(path string) string {
	rel, err := workdir.CleanRel(path)
	if err != nil || rel == "." {
		return "."
	}
	for i := len(rel) - 1; i >= 0; i-- {
		if rel[i] == '/' {
			return rel[i+1:]
		}
	}
	return rel
}

// ReadFile streams a regular file, or the range of it asked for.
func (s *filesService) ReadFile(req *roostv1.ReadFileRequest, stream roostv1.FilesService_ReadFileServer) error {
	if req.GetOffset() < 0 || req.GetLength() < 0 {
		return fmt.Errorf("offset %d, length %d: must not be negative: %w", req.GetOffset(), req.GetLength(), errdefs.ErrInvalidArgument)
	}
	f, st, err := s.m.OpenFile(req.GetSession(), req.GetPath())
	if err != nil {
		return err
	}
	defer f.Close()
	end := st.Size
	if n := req.GetLength(); n > 0 && req.GetOffset() < end-n {
		end = req.GetOffset() + n
	}
	info := fileInfo(baseName(req.GetPath()), &st, "")
	ctx := stream.Context()
	return sendBounded(s.sendTimeout, stream.Send, func(send func(*roostv1.ReadFileResponse) error) error {
		first := &roostv1.ReadFileResponse{Info: info}
		for off := req.GetOffset(); off < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			buf := make([]byte, min(end-off, workdir.ChunkBytes))
			n, err := f.ReadAt(buf, off)
			if n > 0 {
				msg := &roostv1.ReadFileResponse{Data: buf[:n]}
				if first != nil {
					first.Data, msg, first = buf[:n], first, nil
				}
				if err := send(msg); err != nil {
					return err
				}
				off += int64(n)
			}
			if errors.Is(err, io.EOF) {
				// Shorter than when it was opened.
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", req.GetPath(), err)
			}
		}
		if first != nil {
			return send(first)
		}
		return nil
	})
}

// WriteFile writes a regular file from the stream: a header, then its data.
func (s *filesService) WriteFile(stream roostv1.FilesService_WriteFileServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return fmt.Errorf("the first write request must be its header: %w", errdefs.ErrInvalidArgument)
	}
	mode := h.GetMode()
	if mode == 0 {
		mode = 0o644
	}
	if mode&^0o777 != 0 {
		return fmt.Errorf("mode %#o: only the permission bits (0777) may be set: %w", mode, errdefs.ErrInvalidArgument)
	}
	w, err := s.m.CreateFile(stream.Context(), h.GetSession(), h.GetPath(), mode, h.GetCreateOnly())
	if err != nil {
		return err
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil && req.GetHeader() != nil {
			err = fmt.Errorf("a second header: only the first write request is one: %w", errdefs.ErrInvalidArgument)
		}
		if err == nil {
			_, err = w.Write(req.GetData())
		}
		if err != nil {
			w.Abort()
			return err
		}
	}
	st, err := w.Commit()
	if err != nil {
		return err
	}
	return stream.SendAndClose(&roostv1.WriteFileResponse{Info: fileInfo(baseName(h.GetPath()), &st, "")})
}

// ListDir lists a page of a directory; the page token is the directory's own offset.
func (s *filesService) ListDir(_ context.Context, req *roostv1.ListDirRequest) (*roostv1.ListDirResponse, error) {
	if n := req.GetPageSize(); n < 0 || n > workdir.MaxPage {
		return nil, fmt.Errorf("page_size %d: must be 0 to %d: %w", n, workdir.MaxPage, errdefs.ErrInvalidArgument)
	}
	var cookie int64
	if t := req.GetPageToken(); t != "" {
		c, err := strconv.ParseInt(t, 10, 64)
		if err != nil || c < 0 {
			return nil, fmt.Errorf("page_token %q: not one ListDir gave: %w", t, errdefs.ErrInvalidArgument)
		}
		cookie = c
	}
	entries, next, err := s.m.ListDir(req.GetSession(), req.GetPath(), cookie, int(req.GetPageSize()))
	if err != nil {
		return nil, err
	}
	resp := &roostv1.ListDirResponse{Entries: make([]*roostv1.FileInfo, 0, len(entries))}
	for i := range entries {
		e := &entries[i]
		resp.Entries = append(resp.Entries, fileInfo(e.Name, &e.Stat, e.Link))
	}
	if next != 0 {
		resp.NextPageToken = strconv.FormatInt(next, 10)
	}
	return resp, nil
}

// StatFile describes one entry.
func (s *filesService) StatFile(_ context.Context, req *roostv1.StatFileRequest) (*roostv1.StatFileResponse, error) {
	e, err := s.m.StatFile(req.GetSession(), req.GetPath())
	if err != nil {
		return nil, err
	}
	return &roostv1.StatFileResponse{Info: fileInfo(baseName(req.GetPath()), &e.Stat, e.Link)}, nil
}

// RemoveFile removes an entry, a tree with recursive.
func (s *filesService) RemoveFile(ctx context.Context, req *roostv1.RemoveFileRequest) (*roostv1.RemoveFileResponse, error) {
	if err := s.m.RemoveFile(ctx, req.GetSession(), req.GetPath(), req.GetRecursive()); err != nil {
		return nil, err
	}
	return &roostv1.RemoveFileResponse{}, nil
}

// MakeDir makes a directory, its parents too with parents.
func (s *filesService) MakeDir(ctx context.Context, req *roostv1.MakeDirRequest) (*roostv1.MakeDirResponse, error) {
	mode := req.GetMode()
	if mode == 0 {
		mode = 0o755
	}
	if mode&^0o777 != 0 {
		return nil, fmt.Errorf("mode %#o: only the permission bits (0777) may be set: %w", mode, errdefs.ErrInvalidArgument)
	}
	if err := s.m.MakeDir(ctx, req.GetSession(), req.GetPath(), mode, req.GetParents()); err != nil {
		return nil, err
	}
	return &roostv1.MakeDirResponse{}, nil
}

// uploadReader reads an upload's tar bytes from its stream.
type uploadReader struct {
	stream roostv1.FilesService_UploadTreeServer
	buf    []byte
}

func (r *uploadReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		req, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		if req.GetHeader() != nil {
			return 0, fmt.Errorf("a second header: only the first upload request is one: %w", errdefs.ErrInvalidArgument)
		}
		r.buf = req.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// UploadTree unpacks the stream's tar archive into a directory.
func (s *filesService) UploadTree(stream roostv1.FilesService_UploadTreeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return fmt.Errorf("the first upload request must be its header: %w", errdefs.ErrInvalidArgument)
	}
	u, err := s.m.UploadTree(stream.Context(), h.GetSession(), h.GetPath(), &uploadReader{stream: stream})
	if err != nil {
		return err
	}
	return stream.SendAndClose(&roostv1.UploadTreeResponse{
		Directories: u.Directories, Files: u.Files, Symlinks: u.Symlinks, Bytes: u.Bytes,
		Skipped: u.Skipped, SkippedCount: u.SkippedCount,
	})
}

// chunkWriter sends what it is given as DownloadTree messages of at most ChunkBytes, each
// its own copy (the sender sends them after Write returns).
type chunkWriter struct {
	send func(*roostv1.DownloadTreeResponse) error
	ctx  context.Context
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if err := w.ctx.Err(); err != nil {
			return n, err
		}
		k := min(len(p), workdir.ChunkBytes)
		if err := w.send(&roostv1.DownloadTreeResponse{Data: append([]byte(nil), p[:k]...)}); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// DownloadTree streams a tar archive of an entry.
func (s *filesService) DownloadTree(req *roostv1.DownloadTreeRequest, stream roostv1.FilesService_DownloadTreeServer) error {
	return sendBounded(s.sendTimeout, stream.Send, func(send func(*roostv1.DownloadTreeResponse) error) error {
		// Whole chunks: tar writes each header and each small file's data on its own, which
		// would be a message each.
		w := bufio.NewWriterSize(&chunkWriter{send: send, ctx: stream.Context()}, workdir.ChunkBytes)
		if err := s.m.DownloadTree(req.GetSession(), req.GetPath(), w); err != nil {
			return err
		}
		return w.Flush()
	})
}
