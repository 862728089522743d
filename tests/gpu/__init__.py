"""GPU access (powerd/gpu): NVML against a fake pynvml, the simulated GPUs, powerd gpus."""
