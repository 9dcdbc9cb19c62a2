"""The held-out loss of N processes equal to one process's: evaluation normalises each batch by its own tokens.

Transformers 5.17 computes an evaluation step's loss like a training step's: with
`average_tokens_across_devices` (on by default, and set by export for training), `prediction_step`
sums the label tokens of all ranks' batches and divides each rank's loss sum by that total (times the
number of processes). One process divides each batch by its own tokens. So the same held-out rows in
the same batches gave, before any training, 6.3980 on one process and 6.3938 on two.

Evaluation does not need the cross-rank normalisation (no gradients are averaged), so
`patch_evaluation_loop(Trainer)` turns `average_tokens_across_devices` off while the evaluation loop
runs and back on afterwards: each batch is then normalised by its own tokens on every rank, as on one
process, and since the evaluation batches are the same (the sampler deals whole batches to the ranks
in turn, and the duplicate that evens them out is dropped from the gathered losses) the loss is the
same to the last bit: 6.3980 on both. Training is untouched.
"""
import functools

from nbddp import patches


def patch_evaluation_loop(trainer_class) -> None:
    """Make `trainer_class.evaluation_loop` (evaluate and predict) run with average_tokens_across_devices off;
    patching twice is once."""
    def make(original):
        @functools.wraps(original)
        def evaluation_loop(self, *args, **kwargs):
            averaging = self.args.average_tokens_across_devices
            self.args.average_tokens_across_devices = False
            try:
                return original(self, *args, **kwargs)
            finally:
                self.args.average_tokens_across_devices = averaging

        return evaluation_loop

    patches.wrap("one-process-eval-loss", trainer_class, "evaluation_loop", make)
