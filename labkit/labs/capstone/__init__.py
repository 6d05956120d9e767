"""Lab 10's room: a small GPT trained with data, tensor and pipeline parallelism, then
a real run planned.

Taught in: lab 10 (the capstone). ``corpus`` (the text, as bytes), ``gpt`` (the model),
``reference`` (the one-process run every layout is compared with), ``layout`` (which
rank holds which shard of the 2 x 2 x 2 mesh), ``harness`` (what runs the learner's
modules on ranks), ``recorder`` (the collectives and messages a rank sent),
``nccl_order`` (would this order of messages deadlock on NCCL?), ``checks`` (the
exercises), ``measure`` and ``cost_model`` (the measurements and their theory).
Planning a real run (section 6): ``transformer_costs`` (bytes, FLOPs and alpha-beta
links of an H100 cluster: the capstone's own copies of labs 05-07's formulas), ``plan_costs``
and ``planner`` (score a plan, search every legal one), ``published`` (torchtitan's,
Llama 3's and Megatron-LM's layouts to hold the models against) and ``plan_verdicts``
(what the planning exercises' checks judge and explain). ``evidence`` and ``hints``
read a failing run's numbers and messages into the mistake they point to.
"""

# What every rank of this lab imports: labkit's helper imports it once (_forkserver).
RANK_MODULES = ["labkit.labs.capstone.harness"]
