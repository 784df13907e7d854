"""What a run measures: its settings and presets (``settings``), the knob study's knobs (``knobs``), and Horovod's
synthetic benchmarks as workloads (``synthetic``: their flags, models and output lines). Importable without
TensorFlow."""
