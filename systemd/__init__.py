"""The systemd unit and the example /etc/edgeserve/config.toml, installed as `edgeserve.systemd`
package data so that `edgeserve install-service` finds them in a wheel as in a checkout."""
