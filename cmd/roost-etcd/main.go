// roost-etcd is etcd's own server (go.etcd.io/etcd/server/v3's etcdmain), built from the
// version roost's go.mod pins: an etcd a roost fleet can run, and that roost's end-to-end
// tests run as separate processes, with nothing fetched at run time. It takes etcd's flags
// and environment (ETCD_*) unchanged; roost-etcd --help lists them.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
