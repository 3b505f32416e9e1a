package route

import (
	"google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// refOf reads the session a request is about; ok is false when m is not the request type
// the table says, which New refuses.
type refOf func(m proto.Message) (ref string, ok bool)

func field[T proto.Message](get func(T) string) refOf {
	return func(m proto.Message) (string, bool) {
		t, ok := m.(T)
		if !ok {
			return "", false
		}
		return get(t), true
	}
}

// routed are the methods about one session, by full name, each with how to read the
// session's ref from its request; for a method whose client streams, from the first
// message. A call with an empty ref is served where it arrives.
var routed = map[string]refOf{
	roostv1.SessionService_Launch_FullMethodName:     field((*roostv1.LaunchRequest).GetId),
	roostv1.SessionService_Get_FullMethodName:        field((*roostv1.GetRequest).GetId),
	roostv1.SessionService_Wait_FullMethodName:       field((*roostv1.WaitRequest).GetId),
	roostv1.SessionService_Stop_FullMethodName:       field((*roostv1.StopRequest).GetId),
	roostv1.SessionService_Kill_FullMethodName:       field((*roostv1.KillRequest).GetId),
	roostv1.SessionService_Pause_FullMethodName:      field((*roostv1.PauseRequest).GetId),
	roostv1.SessionService_Resume_FullMethodName:     field((*roostv1.ResumeRequest).GetId),
	roostv1.SessionService_Remove_FullMethodName:     field((*roostv1.RemoveRequest).GetId),
	roostv1.SessionService_Logs_FullMethodName:       field((*roostv1.LogsRequest).GetId),
	roostv1.SessionService_Exec_FullMethodName:       field(func(r *roostv1.ExecRequest) string { return r.GetStart().GetId() }),
	roostv1.SessionService_AttachExec_FullMethodName: field((*roostv1.AttachExecRequest).GetId),
	roostv1.SessionService_WaitExec_FullMethodName:   field((*roostv1.WaitExecRequest).GetId),
	roostv1.SessionService_KillExec_FullMethodName:   field((*roostv1.KillExecRequest).GetId),
	roostv1.SessionService_ListExecs_FullMethodName:  field((*roostv1.ListExecsRequest).GetId),

	roostv1.FilesService_ReadFile_FullMethodName:     field((*roostv1.ReadFileRequest).GetSession),
	roostv1.FilesService_WriteFile_FullMethodName:    field(func(r *roostv1.WriteFileRequest) string { return r.GetHeader().GetSession() }),
	roostv1.FilesService_ListDir_FullMethodName:      field((*roostv1.ListDirRequest).GetSession),
	roostv1.FilesService_StatFile_FullMethodName:     field((*roostv1.StatFileRequest).GetSession),
	roostv1.FilesService_RemoveFile_FullMethodName:   field((*roostv1.RemoveFileRequest).GetSession),
	roostv1.FilesService_MakeDir_FullMethodName:      field((*roostv1.MakeDirRequest).GetSession),
	roostv1.FilesService_UploadTree_FullMethodName:   field(func(r *roostv1.UploadTreeRequest) string { return r.GetHeader().GetSession() }),
	roostv1.FilesService_DownloadTree_FullMethodName: field((*roostv1.DownloadTreeRequest).GetSession),

	// A session's trace of model calls is in its records directory, on its node.
	roostv1.SpendService_ListCalls_FullMethodName: field((*roostv1.ListCallsRequest).GetSessionId),
	// Explaining a session (not a capsule) reads what it was staged with.
	roostv1.CapsuleService_Explain_FullMethodName: field((*roostv1.ExplainRequest).GetSession),
}

// byNode are the methods about one node of the fleet, by full name, each with how to read
// the node's name from its request: served where they arrive when it names none or this
// node, forwarded to that node's listener otherwise.
var byNode = map[string]refOf{
	// A node's events are in its own registry, numbered by it.
	roostv1.SessionService_Events_FullMethodName: field((*roostv1.EventsRequest).GetNode),
}

// servedHere are the methods about no one session, or about this node: always served where
// they arrive. A method in neither list is served here too, but a test holds every method
// the server registers to one of them, so that a new one is classified when it is added.
var servedHere = []string{
	// Stage is placed (pkg/fleet/placement), which forwards it through Router.Stage.
	roostv1.SessionService_Stage_FullMethodName,
	// This node's sessions and retention; the fleet's, as this node reads etcd.
	roostv1.SessionService_List_FullMethodName,
	roostv1.SessionService_Prune_FullMethodName,
	roostv1.SessionService_ListFleet_FullMethodName,

	// Each node has its own artifact store.
	roostv1.ArtifactService_Push_FullMethodName,
	roostv1.ArtifactService_ListArtifacts_FullMethodName,
	roostv1.ArtifactService_RemoveArtifact_FullMethodName,

	roostv1.SystemService_Health_FullMethodName,
	roostv1.SystemService_Version_FullMethodName,
	roostv1.SystemService_Doctor_FullMethodName,

	// The node's own ledger, and the fleet's as this node reads etcd.
	roostv1.SpendService_GetDay_FullMethodName,
	roostv1.SpendService_SetMachineLimit_FullMethodName,
	roostv1.SpendService_GetFleet_FullMethodName,
	roostv1.SpendService_SetFleetLimit_FullMethodName,
	roostv1.SpendService_ListFleetNodes_FullMethodName,
	roostv1.SpendService_ForgetFleetNode_FullMethodName,

	grpc_health_v1.Health_Check_FullMethodName,
	grpc_health_v1.Health_List_FullMethodName,
	grpc_health_v1.Health_Watch_FullMethodName,
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName,
}
