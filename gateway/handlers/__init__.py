"""The gateway's HTTP and websocket endpoints."""

from kernelfleet.gateway.handlers.channels import ChannelsHandler
from kernelfleet.gateway.handlers.events import FleetEventsHandler, FleetEventsStreamHandler
from kernelfleet.gateway.handlers.fleet import (
    FleetHandler,
    FleetHostDrainHandler,
    FleetHostHandler,
    FleetHostsHandler,
    FleetKernelHandler,
    FleetKernelsHandler,
    KernelGpusHandler,
    KernelMigrateHandler,
    OpenApiHandler,
    ReplicaMigrateHandler,
    ServingHandler,
)
from kernelfleet.gateway.handlers.gpu_settings import KernelGpuSettingsHandler
from kernelfleet.gateway.handlers.host_link import HostLinkHandler
from kernelfleet.gateway.handlers.jobs import job_routes
from kernelfleet.gateway.handlers.jupyter import (
    KernelActionHandler,
    KernelHandler,
    KernelsHandler,
    KernelSpecHandler,
    KernelSpecResourceHandler,
    KernelSpecsHandler,
)
from kernelfleet.gateway.handlers.metrics import MetricsHandler
from kernelfleet.gateway.handlers.tool_workers import tool_worker_routes
from kernelfleet.web import NotFoundHandler

_KERNEL_ID = r"(?P<kernel_id>[\w-]+)"


def routes() -> list[tuple[str, type]]:
    """URL patterns for every endpoint, most specific first. What a kernel-scoped token may
    do on each is its handler's ``kernel_access`` (`kernelfleet.web.TokenAuthMixin`)."""
    return [
        (r"/api/kernelspecs/?", KernelSpecsHandler),
        (r"/api/kernelspecs/(?P<name>[^/]+)/?", KernelSpecHandler),
        (r"/kernelspecs/(?P<name>[^/]+)/(?P<filename>[^/]+)", KernelSpecResourceHandler),
        (r"/api/kernels/?", KernelsHandler),
        (rf"/api/kernels/{_KERNEL_ID}/?", KernelHandler),
        (rf"/api/kernels/{_KERNEL_ID}/(?P<action>interrupt|restart)/?", KernelActionHandler),
        (rf"/api/kernels/{_KERNEL_ID}/channels", ChannelsHandler),
        (r"/api/fleet/?", FleetHandler),
        (r"/api/fleet/openapi\.json", OpenApiHandler),
        (r"/api/fleet/events/?", FleetEventsHandler),
        (r"/api/fleet/events/stream", FleetEventsStreamHandler),
        (r"/api/fleet/serving/?", ServingHandler),
        (r"/api/fleet/hosts/?", FleetHostsHandler),
        (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/link", HostLinkHandler),
        (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/drain", FleetHostDrainHandler),
        (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/?", FleetHostHandler),
        (r"/api/fleet/kernels/?", FleetKernelsHandler),
        (rf"/api/fleet/kernels/{_KERNEL_ID}/?", FleetKernelHandler),
        (rf"/api/fleet/kernels/{_KERNEL_ID}/migrate/?", KernelMigrateHandler),
        (rf"/api/fleet/kernels/{_KERNEL_ID}/gpus/?", KernelGpusHandler),
        (rf"/api/fleet/kernels/{_KERNEL_ID}/gpu-settings/?", KernelGpuSettingsHandler),
        (
            rf"/api/fleet/kernels/{_KERNEL_ID}/replicas/(?P<replica_id>[\w.-]+)/migrate/?",
            ReplicaMigrateHandler,
        ),
        *tool_worker_routes(_KERNEL_ID),
        *job_routes(),
        (r"/metrics", MetricsHandler),
        (r".*", NotFoundHandler),
    ]
