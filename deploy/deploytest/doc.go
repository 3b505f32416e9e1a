// Package deploytest answers whether the operator assets in deploy/ would run roostd as they
// say: its tests decode the Kubernetes manifests strictly with the upstream API types, the
// Nomad job into a documented subset of Nomad's job specification, and the systemd drop-in
// and etcd members' environment files, and hold every flag they give roostd and roost-etcd to
// the binaries built from this tree (deploy/check.sh runs systemd-analyze verify on the units).
package deploytest
