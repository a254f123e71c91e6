"""The one placement engine of every launcher (`make run`, and `make up` on Slurm, Docker or this machine).

types: the cluster, a service's assignment, the placement. assign: `place`. nodes, gpus, ports: its parts
(gpus holds the colocation rule). commands: what each assignment runs. table: what every launcher prints.
"""

from .assign import place
from .table import format_placement
from .types import Assignment, Cluster, Placement, PlacementError

__all__ = ["Assignment", "Cluster", "Placement", "PlacementError", "format_placement", "place"]
