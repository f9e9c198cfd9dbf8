# The project and its dev extra (torch==2.13.0 CPU wheel is on this machine's disk).
python -m pip install -q -e '.[dev]'
