"""The trainer that runtime/train.py's worker runs for each plan, one concern a module (as torchtitan's trainer):

- `build`: this rank's stages, optimizer, resumed state, step function, prefetcher and step log (`Trainer`)
- `step`: one step queued on the device with its timing marks (`launch_step`), --trace-step / --memory-step
- `log`: a launched step read back and logged (`StepLog.record`); the stop flag every rank agrees on
- `results_csv`: rank 0's step CSV (columns, appending, a resumed run's superseded rows)
- `loop`: the step loop with its checkpoints, the exit checkpoint (`run_steps`, `finish_run`, `train_plan`)
- `components`: --components-out's extra step traced on the GPU, written as JSON
"""
