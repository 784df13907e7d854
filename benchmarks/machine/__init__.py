"""This machine: starting a job's processes as mpirun ranks or a TF_CONFIG cluster (``launch``), what it runs
(``envinfo``), its memory-copy rate (``memcopy``), free ports (``util``)."""
