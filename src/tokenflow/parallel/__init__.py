"""Expert parallelism: the MoE layer split over processes with torch.distributed all-to-all
(``python -m tokenflow.parallel.expert_parallel --nproc 4``)."""
