"""Expert parallelism: the MoE layer split over processes with torch.distributed all-to-all
(``python -m tokenflow.parallel.expert_parallel --nproc 4``).

``ep_layer``         which rank owns which experts; one rank's forward (:func:`ep_forward`)
``expert_parallel``  spawning the ranks (:func:`run_expert_parallel`), the what-if routing
                     simulation and the command line
"""
