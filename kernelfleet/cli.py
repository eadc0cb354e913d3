"""The ``kernelfleet`` console script: one subcommand per process kind."""

from __future__ import annotations

from traitlets.config import Application

from kernelfleet import __version__


class KernelfleetApp(Application):
    """Dispatches to the subcommands; alone it prints help."""

    name = "kernelfleet"
    version = __version__
    description = "Replicated Jupyter kernels that hold GPUs only while a cell runs."
    subcommands = {
        "up": (
            "kernelfleet.gateway.up.UpApp",
            "Start a gateway and N local host agents with virtual GPUs, in the foreground.",
        ),
        "gateway": (
            "kernelfleet.gateway.app.GatewayApp",
            "Start the gateway (the Jupyter gateway API and the fleet admin API).",
        ),
        "gateway-proxy": (
            "kernelfleet.gateway.proxy_app.GatewayProxyApp",
            "Forward one address to whichever gateway member serves.",
        ),
        "simulate": ("kernelfleet.scheduler.simulator.app.SimulateApp", "Simulate a trace."),
        "demand": (
            "kernelfleet.scheduler.demand_app.DemandApp",
            "The autoscaler's demand model ('train' writes one).",
        ),
        "simulate-jobs": (
            "kernelfleet.scheduler.jobs.app.SimulateJobsApp",
            "Simulate a job trace.",
        ),
        "pipeline-plan": (
            "kernelfleet.tools.pipeline.app.PipelinePlanApp",
            "Split a profiled model into replicated pipeline stages (PipeDream's planner).",
        ),
        "replay": (
            "kernelfleet.replay.app.ReplayApp",
            "Replay a trace against a live gateway, as a population of notebook users.",
        ),
        "bridge": (
            "kernelfleet.bridge.BridgeApp",
            "Serve a Jupyter connection file with a kernel of a gateway (kernelspecs: 'install').",
        ),
        "host": (
            "kernelfleet.kernels.agent.app.HostAgentApp",
            "Start a host agent: GPU inventory and kernel launcher for one machine.",
        ),
        "image": (
            "kernelfleet.kernels.agent.containers.app.ImageApp",
            "Build kernel images for the container runtime ('build --base IMAGE --tag TAG').",
        ),
    }

    def start(self) -> None:
        if self.subapp is not None:
            self.subapp.start()
            return
        self.print_help()
        self.exit(1)


def main() -> None:
    KernelfleetApp.launch_instance()
