"""The whole process's configuration: the server TOML, its checks, the upstreams, what a reload may change.

Below the runtime and the fronts, above only the foundation: it names backends, precisions and
policies as strings and leaves their classes to the layers that build them.
"""

from edgeserve.config.checks import ConfigError
from edgeserve.config.server import (
    BackendConfig,
    ListenConfig,
    LoggingConfig,
    MetricsConfig,
    ModelConfig,
    PreprocessConfig,
    SchedulerConfig,
    ServerConfig,
)
from edgeserve.config.upstreams import UpstreamConfig

__all__ = [
    "BackendConfig",
    "ConfigError",
    "ListenConfig",
    "LoggingConfig",
    "MetricsConfig",
    "ModelConfig",
    "PreprocessConfig",
    "SchedulerConfig",
    "ServerConfig",
    "UpstreamConfig",
]
