"""`make up` on Slurm: srun steps inside an allocation, or a batch job that does the same."""
