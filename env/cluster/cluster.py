#!/usr/bin/env python3
"""A cluster in a box: 2-4 network-namespace "nodes" on a shaped link (needs root).

    sudo .venv/bin/python env/cluster/cluster.py check
    sudo .venv/bin/python env/cluster/cluster.py up --nodes 2 --profile 1gbe
    sudo .venv/bin/python env/cluster/cluster.py run node1 -- hostname

The command line of labkit.cluster (one implementation); env/cluster/README.md
explains it.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # labkit, uninstalled

from labkit.cluster import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
