package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The operator's image import travels over the CRI socket as one more gRPC service, so it needs no
// second endpoint: a client stream of chunks, with the reference and digest in the metadata.
const (
	importService  = "cocooncri.admin.v1.Images"
	importMethod   = "/" + importService + "/Import"
	importRefKey   = "x-cocoon-cri-ref"
	importDigestKy = "x-cocoon-cri-digest"
	// importChunk is how much of the file one message carries.
	importChunk = 1 << 20
)

var importStream = grpc.StreamDesc{StreamName: "Import", ClientStreams: true}

// RegisterImport adds the image import service to a gRPC server.
func (s *Runtime) RegisterImport(g *grpc.Server) {
	desc := importStream
	desc.Handler = func(_ any, stream grpc.ServerStream) error { return s.serveImport(stream) }
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: importService,
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{desc},
	}, s)
}

func (s *Runtime) serveImport(stream grpc.ServerStream) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	ref, digest := firstOr(md.Get(importRefKey), ""), firstOr(md.Get(importDigestKy), "")
	if ref == "" || digest == "" {
		return invalid("image import needs a reference and the file's sha256 digest")
	}
	pr, pw := io.Pipe()
	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		img, err := s.images.Import(stream.Context(), ref, digest, pr)
		// Unblocks the receive loop when the import stops reading early.
		pr.CloseWithError(errImportDone)
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{id: img.ID}
	}()
	// All stream calls stay on this goroutine.
	for {
		var chunk wrapperspb.BytesValue
		err := stream.RecvMsg(&chunk)
		if errors.Is(err, io.EOF) {
			pw.Close()
			break
		}
		if err != nil {
			pw.CloseWithError(err)
			break
		}
		if _, err := pw.Write(chunk.GetValue()); err != nil {
			break
		}
	}
	r := <-done
	if r.err != nil {
		s.log.Error("image import failed", "ref", ref, "err", r.err)
		return r.err
	}
	return stream.SendMsg(wrapperspb.String(r.id))
}

var errImportDone = errors.New("import finished")

// ImportImage sends r to the daemon behind conn, to be imported under ref; digest is the sha256 of
// r's bytes. It returns the image ID.
func ImportImage(ctx context.Context, conn grpc.ClientConnInterface, ref, digest string, r io.Reader) (string, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, importRefKey, ref, importDigestKy, digest)
	stream, err := conn.NewStream(ctx, &importStream, importMethod)
	if err != nil {
		return "", err
	}
	buf := make([]byte, importChunk)
	for {
		n, readErr := r.Read(buf)
		if n > 0 {
			if err := stream.SendMsg(wrapperspb.Bytes(buf[:n])); err != nil {
				// The server stopped reading (it answered early or failed): its answer says why.
				if errors.Is(err, io.EOF) {
					break
				}
				return "", err
			}
		}
		if errors.Is(readErr, io.EOF) {
			break
		}
		if readErr != nil {
			return "", fmt.Errorf("read image file: %w", readErr)
		}
	}
	if err := stream.CloseSend(); err != nil {
		return "", err
	}
	var id wrapperspb.StringValue
	if err := stream.RecvMsg(&id); err != nil {
		return "", err
	}
	return id.GetValue(), nil
}
