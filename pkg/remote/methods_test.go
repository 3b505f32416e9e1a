package remote

import (
	"strings"
	"testing"

	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// Every method on the reader list is one the API serves: a renamed or misspelt method would
// be denied to readers without a word (default deny), and its new name never listed.
func TestReaderMethodsExist(t *testing.T) {
	// Load the descriptors of the services the list names.
	_ = roostv1.File_roost_v1_session_proto
	_ = roostv1.File_roost_v1_files_proto
	_ = grpc_health_v1.File_grpc_health_v1_health_proto
	for _, m := range ReaderMethods() {
		service, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		if !ok {
			t.Errorf("%s: not /SERVICE/METHOD", m)
			continue
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
		if err != nil {
			t.Errorf("%s: no service %s: %v", m, service, err)
			continue
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok || sd.Methods().ByName(protoreflect.Name(method)) == nil {
			t.Errorf("%s: %s has no method %s", m, service, method)
		}
	}
}
