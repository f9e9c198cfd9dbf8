# The project and its dev extra (torch==2.13.0 CPU wheel is on this machine's disk).
python -m pip install -q -e '.[dev]'
# The engine's CPU decode kernels, as the README's install builds them: a missing compiler or header fails here,
# saying what to install (the tests run with HRL_CPU_KERNELS=on, so they would fail anyway, less clearly).
python -m research.serving.cpu_kernels build
