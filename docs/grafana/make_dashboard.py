"""Writes edgeserve-dashboard.json, a Grafana dashboard over the metrics of docs/metrics.md.

The panels are the questions an operator asks of a box left alone: is it answering, is it missing
deadlines, how late is the tail, is a queue building, which exits does it pick, is the accelerator
saturated, how much goes upstream and is the upstream healthy, and does memory grow.

    python docs/grafana/make_dashboard.py     # rewrites docs/grafana/edgeserve-dashboard.json

Import it in Grafana (Dashboards -> New -> Import) and pick the Prometheus data source.
"""

from __future__ import annotations

import json
from pathlib import Path

# (title, unit, [(PromQL, legend)]); $instance is the dashboard's variable.
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Answers per second by status",
        "reqps",
        [('sum by (status) (rate(edgeserve_requests_total{instance=~"$instance"}[1m]))', "{{status}}")],
    ),
    (
        "Deadline violation ratio by model",
        "percentunit",
        [
            (
                'sum by (model) (rate(edgeserve_deadline_violations_total{instance=~"$instance"}[5m]))'
                ' / sum by (model) (rate(edgeserve_requests_total{instance=~"$instance"}[5m]))',
                "{{model}}",
            )
        ],
    ),
    (
        "P95 latency (arrival to answer, ok answers)",
        "s",
        [
            (
                "histogram_quantile(0.95, sum by (model, le) "
                '(rate(edgeserve_request_duration_seconds_bucket{instance=~"$instance"}[5m])))',
                "{{model}}",
            )
        ],
    ),
    (
        "Queue depth",
        "short",
        [('edgeserve_queue_depth{instance=~"$instance"}', "{{model}}")],
    ),
    (
        "Exit mix (answers per second by exit)",
        "reqps",
        [
            (
                'sum by (model, exit) (rate(edgeserve_exit_total{instance=~"$instance"}[1m]))',
                "{{model}} {{exit}}",
            )
        ],
    ),
    (
        "Executor utilisation",
        "percentunit",
        [
            ('edgeserve_executor_utilization{instance=~"$instance"}', "last 10 s"),
            ('rate(edgeserve_executor_busy_seconds_total{instance=~"$instance"}[5m])', "5 min"),
        ],
    ),
    (
        "Scheduler decision time p99",
        "s",
        [
            (
                "histogram_quantile(0.99, sum by (le) "
                '(rate(edgeserve_scheduler_decision_seconds_bucket{instance=~"$instance"}[5m])))',
                "p99",
            )
        ],
    ),
    (
        "Served where (answers per second)",
        "reqps",
        [('sum by (where) (rate(edgeserve_served_total{instance=~"$instance"}[1m]))', "{{where}}")],
    ),
    (
        "Upstream round trip and open breakers",
        "s",
        [
            ('edgeserve_upstream_rtt_seconds{instance=~"$instance"}', "RTT {{upstream}}"),
            ('edgeserve_upstream_state{instance=~"$instance", state="open"}', "open {{upstream}}"),
        ],
    ),
    (
        "Resident memory",
        "bytes",
        [('process_resident_memory_bytes{instance=~"$instance"}', "RSS")],
    ),
    # The accelerators (docs/metrics.md, "Accelerators"): empty where a box has no such source.
    (
        "GPU utilisation (NVML: discrete GPU; sysfs: Jetson)",
        "percentunit",
        [
            ('nv_gpu_utilization{instance=~"$instance"}', "{{gpu_uuid}}"),
            ('edgeserve_jetson_gpu_load{instance=~"$instance"}', "Jetson GPU"),
        ],
    ),
    (
        "Accelerator power",
        "watt",
        [
            ('nv_gpu_power_usage{instance=~"$instance"}', "{{gpu_uuid}}"),
            ('nv_gpu_power_limit{instance=~"$instance"}', "limit {{gpu_uuid}}"),
            ('edgeserve_jetson_rail_power_watts{instance=~"$instance"}', "{{rail}}"),
        ],
    ),
    (
        "GPU memory used",
        "bytes",
        [('nv_gpu_memory_used_bytes{instance=~"$instance"}', "{{gpu_uuid}}")],
    ),
    (
        "Jetson temperatures",
        "celsius",
        [('edgeserve_jetson_temperature_celsius{instance=~"$instance"}', "{{zone}}")],
    ),
    (
        "Jetson clocks",
        "hertz",
        [('edgeserve_jetson_clock_hertz{instance=~"$instance"}', "{{clock}}")],
    ),
    (
        "Energy (NVML, joules per second)",
        "watt",
        [('rate(nv_energy_consumption{instance=~"$instance"}[5m])', "{{gpu_uuid}}")],
    ),
]


def dashboard() -> dict:
    panels = []
    for i, (title, unit, queries) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend}
                    for k, (expr, legend) in enumerate(queries)
                ],
            }
        )
    return {
        "title": "edgeserve",
        "uid": "edgeserve",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "instance",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(edgeserve_requests_total, instance)",
                    "includeAll": True,
                    "multi": True,
                },
            ]
        },
        "panels": panels,
    }


def main() -> None:
    path = Path(__file__).with_name("edgeserve-dashboard.json")
    path.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
