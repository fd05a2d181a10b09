"""`plan validate plan.json --simulate`: every distinct rank of a plan built and stepped on one CPU machine under
PyTorch's fake process group and fake tensors, its memory and collectives set beside the planner's prediction.

fake_world.py sets up the fake world and device; tracker.py traces a step's memory by part and its collectives;
memory.py and predict.py restate the planner's memory parts and collective bytes per rank; roles.py picks the
ranks; run.py simulates one rank; report.py prints the table and the JSON; __main__.py runs each rank in its own
process. Nothing here is imported by the training path.
"""
