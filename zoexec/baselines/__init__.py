"""The baselines zoexec is measured against, written here from their published
algorithms and run as their code runs: MeZO (every weight on the device) and ZO2
(blocks streamed from host memory). `zoexec baseline mezo|zo2` times them on the same
model, batch and precision as a zoexec run (docs/gpu.md)."""
