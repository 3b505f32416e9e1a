package deploytest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"roost.dev/roost/pkg/config"
)

// capsuleTaint is the taint of the node pool roostd runs on.
var capsuleTaint = corev1.Taint{Key: "roost.dev/capsules", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// k8sObjects are deploy/kubernetes's manifests, each decoded strictly (an unknown,
// misspelt, miscased or repeated field fails) into its upstream type.
type k8sObjects struct {
	namespaces []*corev1.Namespace
	configMaps []*corev1.ConfigMap
	services   []*corev1.Service
	daemonSets []*appsv1.DaemonSet
	monitors   []*monitoringv1.ServiceMonitor
}

func decodeKubernetes(t *testing.T) *k8sObjects {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repo, "deploy/kubernetes/*.yaml"))
	if len(files) == 0 {
		t.Fatal("deploy/kubernetes holds no manifests")
	}
	objs := &k8sObjects{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`(?m)^---`).Match(data) {
			t.Fatalf("%s: one object per file (a --- separator found)", f)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(data, &tm); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var obj any
		var want string
		switch tm.Kind {
		case "Namespace":
			o := &corev1.Namespace{}
			obj, want, objs.namespaces = o, "v1", append(objs.namespaces, o)
		case "ConfigMap":
			o := &corev1.ConfigMap{}
			obj, want, objs.configMaps = o, "v1", append(objs.configMaps, o)
		case "Service":
			o := &corev1.Service{}
			obj, want, objs.services = o, "v1", append(objs.services, o)
		case "DaemonSet":
			o := &appsv1.DaemonSet{}
			obj, want, objs.daemonSets = o, "apps/v1", append(objs.daemonSets, o)
		case "ServiceMonitor":
			o := &monitoringv1.ServiceMonitor{}
			obj, want, objs.monitors = o, "monitoring.coreos.com/v1", append(objs.monitors, o)
		default:
			// RBAC among them: roostd never calls the Kubernetes API.
			t.Fatalf("%s: kind %q is not one deploy/kubernetes is meant to hold (Namespace, ConfigMap, Service, DaemonSet, ServiceMonitor)", f, tm.Kind)
		}
		if tm.APIVersion != want {
			t.Fatalf("%s: %s has apiVersion %q, want %q", f, tm.Kind, tm.APIVersion, want)
		}
		// As the API server's strict field validation: YAML to JSON refusing duplicate keys,
		// then JSON with field names matched case-sensitively (encoding/json, under
		// yaml.UnmarshalStrict, would take hostPid for hostPID) and unknown or duplicate
		// fields refused.
		js, err := yaml.YAMLToJSONStrict(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err == nil {
			err = errors.Join(strict...)
		}
		if err != nil {
			t.Fatalf("%s: strict decode as %s %s: %v", f, want, tm.Kind, err)
		}
	}
	for kind, n := range map[string]int{"Namespace": len(objs.namespaces), "ConfigMap": len(objs.configMaps), "Service": len(objs.services), "DaemonSet": len(objs.daemonSets), "ServiceMonitor": len(objs.monitors)} {
		if n != 1 {
			t.Fatalf("deploy/kubernetes: %d %s manifests, want 1", n, kind)
		}
	}
	return objs
}

// expandK8s expands $(VAR) in a container's argument as the kubelet does, from its env; a
// variable it does not define is an error (the kubelet would pass "$(VAR)" through as is).
func expandK8s(arg string, env map[string]string) (string, error) {
	var missing []string
	out := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(arg, func(m string) string {
		v, ok := env[m[2:len(m)-1]]
		if !ok {
			missing = append(missing, m)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%q names %v, which the container's env does not define", arg, missing)
	}
	return out, nil
}

func TestKubernetes(t *testing.T) {
	bin := build(t)
	objs := decodeKubernetes(t)
	ns, cm, svc, ds, sm := objs.namespaces[0], objs.configMaps[0], objs.services[0], objs.daemonSets[0], objs.monitors[0]
	for _, m := range []metav1.ObjectMeta{cm.ObjectMeta, svc.ObjectMeta, ds.ObjectMeta, sm.ObjectMeta} {
		if m.Namespace != ns.Name {
			t.Errorf("%s is in namespace %q, not %q (namespace.yaml)", m.Name, m.Namespace, ns.Name)
		}
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s: pod-security.kubernetes.io/enforce is %q: Pod Security Admission would refuse roostd's privileged, hostPID pods", ns.Name, ns.Labels["pod-security.kubernetes.io/enforce"])
	}

	pod := ds.Spec.Template.Spec
	if !labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet %s: its selector %v does not select its own pods' labels %v", ds.Name, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	if !pod.HostPID {
		t.Error("DaemonSet: hostPID is not true: sessions' roost-init processes would be in the pod's PID namespace and die with a roostd restart")
	}
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("DaemonSet: hostNetwork %v, dnsPolicy %q: want the host's network (sessions outlive the pod) with ClusterFirstWithHostNet", pod.HostNetwork, pod.DNSPolicy)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("DaemonSet: automountServiceAccountToken is not false: roostd never calls the Kubernetes API and needs no token")
	}
	tolerated := slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.ToleratesTaint(logr.Discard(), &capsuleTaint, false)
	})
	if !tolerated {
		t.Errorf("DaemonSet: no toleration of the capsule pool's taint %s (tolerations %+v)", capsuleTaint.ToString(), pod.Tolerations)
	}
	if pod.NodeSelector[capsuleTaint.Key] != capsuleTaint.Value {
		t.Errorf("DaemonSet: nodeSelector %v does not pick the capsule pool (%s=%s)", pod.NodeSelector, capsuleTaint.Key, capsuleTaint.Value)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("DaemonSet: %d containers, want roostd alone", len(pod.Containers))
	}
	c := pod.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("DaemonSet: the roostd container is not privileged: roostd makes namespaces, cgroups and mounts for sessions")
	}
	// roostd in the host's cgroup namespace (see daemonset.yaml): nsenter into PID 1's.
	if len(c.Command) < 4 || c.Command[0] != "nsenter" || !slices.Contains(c.Command, "--cgroup=/proc/1/ns/cgroup") || path.Base(c.Command[len(c.Command)-1]) != "roostd" {
		t.Errorf("DaemonSet: command %q does not start roostd in the host's cgroup namespace (nsenter --cgroup=/proc/1/ns/cgroup -- .../roostd)", c.Command)
	}

	// The container's env, the downward API's fields given sample values.
	env := map[string]string{}
	fieldOf := map[string]string{}
	sample := map[string]string{"spec.nodeName": "node-a", "metadata.name": "roostd-x7k2p", "status.hostIP": "192.0.2.10", "status.podIP": "192.0.2.10"}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			fieldOf[e.Name] = e.ValueFrom.FieldRef.FieldPath
			v, ok := sample[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("DaemonSet: env %s: field %s has no sample value here", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		}
	}
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		x, err := expandK8s(a, env)
		if err != nil {
			t.Fatalf("DaemonSet: args[%d]: %v", i, err)
		}
		args[i] = x
	}
	if err := bin.checkRoostdArgs("DaemonSet args", args); err != nil {
		t.Error(err)
	}
	if m := regexp.MustCompile(`^--node-name=\$\(([A-Za-z_0-9]+)\)$`).FindStringSubmatch(strings.Join(slices.DeleteFunc(slices.Clone(c.Args), func(a string) bool { return !strings.HasPrefix(a, "--node-name") }), " ")); m == nil || fieldOf[m[1]] != "spec.nodeName" {
		t.Errorf("DaemonSet: --node-name is not $(VAR) of an env var from the downward API's spec.nodeName (args %q)", c.Args)
	}

	// Volumes, and what is mounted where.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mountOf := func(p string) (corev1.VolumeMount, corev1.Volume, bool) {
		var best corev1.VolumeMount
		for _, m := range c.VolumeMounts {
			if (p == m.MountPath || strings.HasPrefix(p, m.MountPath+"/")) && len(m.MountPath) > len(best.MountPath) {
				best = m
			}
		}
		v, ok := volumes[best.Name]
		return best, v, ok
	}
	flag := func(name string) string {
		v, ok := flagValue(args, name)
		if !ok {
			t.Errorf("DaemonSet: roostd is given no --%s", name)
		}
		return v
	}
	stateDir := flag("state-dir")
	if m, v, ok := mountOf(stateDir); !ok || m.MountPath != stateDir || v.HostPath == nil {
		t.Errorf("DaemonSet: --state-dir %s is not a hostPath volume mounted there: roostd's registry and sessions' workdirs would die with the pod", stateDir)
	} else if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("DaemonSet: the state directory's mount has propagation %v, want Bidirectional: the network namespaces roostd pins there must reach the next pod", m.MountPropagation)
	}
	if cg := flag("cgroup-parent"); cg == "" {
		t.Error("DaemonSet: --cgroup-parent is empty: sessions' cgroups must go outside the pod's")
	}
	if m, v, ok := mountOf("/sys/fs/cgroup"); !ok || m.MountPath != "/sys/fs/cgroup" || v.HostPath == nil || v.HostPath.Path != "/sys/fs/cgroup" || m.ReadOnly {
		t.Error("DaemonSet: /sys/fs/cgroup is not the host's, mounted read-write: --cgroup-parent would name a cgroup inside the pod's")
	}
	if sock := flag("socket"); sock != "" {
		if _, v, ok := mountOf(path.Dir(sock)); !ok || v.HostPath == nil {
			t.Errorf("DaemonSet: the control socket's directory %s is not on the host: roostctl on the node cannot reach roostd", path.Dir(sock))
		}
	}

	// The configuration file: from the ConfigMap, and what roostd accepts.
	confPath := flag("config")
	m, v, ok := mountOf(confPath)
	if !ok || v.ConfigMap == nil || v.ConfigMap.Name != cm.Name || m.MountPath != confPath || m.SubPath == "" {
		t.Fatalf("DaemonSet: --config %s is not mounted from the ConfigMap %s by subPath", confPath, cm.Name)
	}
	conf, err := config.Parse([]byte(cm.Data[m.SubPath]), "ConfigMap "+cm.Name+" "+m.SubPath)
	if err != nil {
		t.Fatalf("roostd refuses its configuration: %v", err)
	}
	fromSecret := func(what, p string) {
		if p == "" {
			t.Errorf("DaemonSet: %s is not set", what)
			return
		}
		if _, v, ok := mountOf(p); !ok || v.Secret == nil {
			t.Errorf("DaemonSet: %s %s is not in a mounted Secret", what, p)
		}
	}
	fleetEtcd := conf.Fleet.Etcd
	if v, ok := flagValue(args, "fleet-etcd"); ok {
		fleetEtcd = strings.Split(v, ",")
	}
	if !sameSet(fleetEtcd, fleetClientURLs(t)) {
		t.Errorf("DaemonSet: the fleet's etcd endpoints %v are not deploy/systemd/etcd's members' %v", fleetEtcd, fleetClientURLs(t))
	}
	fromSecret("fleet.etcd_ca", conf.Fleet.EtcdCA)
	fromSecret("fleet.etcd_cert", conf.Fleet.EtcdCert)
	fromSecret("fleet.etcd_key", conf.Fleet.EtcdKey)
	fromSecret("remote.tls_cert", conf.Remote.TLSCert)
	fromSecret("remote.tls_key", conf.Remote.TLSKey)
	fromSecret("remote.client_ca", conf.Remote.ClientCA)
	if len(conf.Remote.Clients) == 0 {
		t.Error("ConfigMap: remote.clients is empty: roostd refuses a remote listener no client may use")
	}

	// Ports: the listener's and the metrics' as the container, the Service and the
	// ServiceMonitor name them.
	portOf := func(flagName string) int32 {
		_, p, err := net.SplitHostPort(flag(flagName))
		if err != nil {
			t.Errorf("DaemonSet: --%s: %v", flagName, err)
			return 0
		}
		var n int32
		fmt.Sscan(p, &n)
		return n
	}
	containerPort := map[string]int32{}
	for _, p := range c.Ports {
		containerPort[p.Name] = p.ContainerPort
	}
	for name, want := range map[string]int32{"remote": portOf("listen-tcp"), "metrics": portOf("metrics-addr")} {
		if containerPort[name] != want {
			t.Errorf("DaemonSet: containerPort %q is %d, but roostd listens on %d", name, containerPort[name], want)
		}
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s: clusterIP %q, want None (headless: a peer names one node)", svc.Name, svc.Spec.ClusterIP)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service %s: selector %v does not select roostd's pods %v", svc.Name, svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	svcPorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = p
		if p.TargetPort.StrVal != "" {
			if _, ok := containerPort[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service %s: port %s targets %q, no port of the container", svc.Name, p.Name, p.TargetPort.StrVal)
			}
		}
	}
	if _, ok := svcPorts["remote"]; !ok {
		t.Errorf("Service %s: no port named remote (the mTLS listener, node to node)", svc.Name)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(svc.Labels)) || sel.Empty() {
		t.Errorf("ServiceMonitor %s: selector %v does not select the Service's labels %v (%v)", sm.Name, sm.Spec.Selector, svc.Labels, err)
	}
	if !sm.Spec.NamespaceSelector.Any && !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace) {
		t.Errorf("ServiceMonitor %s: namespaceSelector %v leaves out %s", sm.Name, sm.Spec.NamespaceSelector, svc.Namespace)
	}
	scraped := false
	for _, ep := range sm.Spec.Endpoints {
		p, ok := svcPorts[ep.Port]
		if !ok {
			t.Errorf("ServiceMonitor %s: endpoint port %q is no port of the Service", sm.Name, ep.Port)
			continue
		}
		job := slices.ContainsFunc(ep.RelabelConfigs, func(r monitoringv1.RelabelConfig) bool {
			return r.TargetLabel == "job" && r.Replacement != nil && *r.Replacement == "roost"
		})
		if p.TargetPort.StrVal == "metrics" && ep.Path == "/metrics" && job {
			scraped = true
		}
	}
	if !scraped {
		t.Errorf("ServiceMonitor %s: no endpoint scrapes the metrics port's /metrics as job roost (the alerts select job=\"roost\")", sm.Name)
	}
}
