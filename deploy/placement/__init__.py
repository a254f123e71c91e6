"""The one placement engine of every launcher (`make run`, and `make up` on Slurm, Docker or this machine).

model: the cluster, a service's assignment, the placement. engine: `place`. nodes, gpus, ports: its parts
(gpus holds the colocation rule). commands: what each assignment runs. table: what every launcher prints.
"""

from .engine import place
from .model import Assignment, Cluster, Placement, PlacementError
from .table import format_placement

__all__ = ["Assignment", "Cluster", "Placement", "PlacementError", "format_placement", "place"]
