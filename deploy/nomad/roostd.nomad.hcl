# roostd on every Nomad client of the capsule pool, as a node of the fleet ledger
# (docs/fleet.md):  nomad job run deploy/nomad/roostd.nomad.hcl
#
# raw_exec, not exec or docker: roostd is itself the sandbox and needs the host as root has
# it (its namespaces, /sys/fs/cgroup, every capability; see deploy/systemd/roostd.service),
# so the clients of this pool enable the raw_exec plugin (plugin "raw_exec" { config {
# enabled = true } } in the client's configuration). The binaries (`make build`, or
# `make install`) and the files named below are installed on each client beforehand.
#
# Sessions outlive a roostd restart: their cgroups go under --cgroup-parent /roost, outside
# the task's own cgroup, which Nomad kills when the task stops; roost-init, not roostd, is
# each session's parent, and the next roostd re-attaches to them.
job "roostd" {
  type        = "system"
  datacenters = ["*"]

  # The capsule pool: clients started with node_class = "roost-capsules".
  constraint {
    attribute = "${node.class}"
    value     = "roost-capsules"
  }

  group "roostd" {
    # A roostd that exits is started again on its node, however often (a system job's
    # allocation is never placed elsewhere).
    restart {
      attempts = 10
      interval = "30m"
      delay    = "5s"
      mode     = "delay"
    }

    network {
      port "metrics" {
        static = 9464
      }
      port "remote" {
        static = 7443
      }
    }

    # roostd's /metrics, for Prometheus' Nomad service discovery (job label roost: the alerts
    # in deploy/prometheus/alerts.yaml select job="roost").
    service {
      name     = "roostd-metrics"
      provider = "nomad"
      port     = "metrics"
      tags     = ["roost", "metrics"]

      check {
        type     = "http"
        path     = "/metrics"
        interval = "15s"
        timeout  = "5s"
      }
    }

    task "roostd" {
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/roostd"
        args = [
          "--config=/etc/roost/roostd.yaml",
          "--state-dir=/var/lib/roost",
          "--socket=/run/roost/roostd.sock",
          "--cgroup-parent=/roost",
          "--fleet-etcd=https://10.0.0.1:2379,https://10.0.0.2:2379,https://10.0.0.3:2379",
          "--fleet-etcd-ca=/etc/roost/etcd/ca.pem",
          "--fleet-etcd-cert=/etc/roost/etcd/node.pem",
          "--fleet-etcd-key=/etc/roost/etcd/node-key.pem",
          # Unique in the fleet and the same across restarts: the Nomad client's name.
          "--node-name=${node.unique.name}",
          "--listen-tcp=${NOMAD_ADDR_remote}",
          "--metrics-addr=${NOMAD_ADDR_metrics}",
        ]
      }

      # SIGTERM: roostd gives back its unspent tokens (at most 10 s) and stops serving;
      # sessions keep running. As deploy/systemd/roostd.service's TimeoutStopSec.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }
}
