"""The process: wires the Server to its fronts and metrics (`edgeserve serve`), reloads on SIGHUP,
talks to systemd (sd_notify, install-service) and checks the box (doctor)."""
