"""From raw timings to the report: summaries derived by pure functions (``analysis``, ``stats``), the alpha-beta
cost model (``costmodel``), the Markdown report and its plots (``report``). No TensorFlow, no processes."""
