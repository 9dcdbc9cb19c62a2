"""The DDP rewrites, applied to one cell's source in order. Each one lives in its own module.

`apply` first turns magics into Python (`convert_magics`), then runs `REWRITES` in order. Each
rewrite records changes at lines of the code it was given; `apply` maps them back to the lines of
the cell as the author wrote it, so the report names the line the author sees.
"""
import difflib

from libcst.metadata import MetadataWrapper

from nbddp.export.rewrites.base import CellLocation, Change, ExportContext, Rewrite
from nbddp.export.rewrites.convert_magics import ConvertMagics, convert_cell
from nbddp.export.rewrites.drop_process_setup import DropProcessSetup
from nbddp.export.rewrites.guard_inference_cell import GuardInferenceCell
from nbddp.export.rewrites.guard_rank0_side_effects import GuardRank0SideEffects
from nbddp.export.rewrites.hoist_unsloth_import import HoistUnslothImport
from nbddp.export.rewrites.inject_device_map import InjectDeviceMap
from nbddp.export.rewrites.plan_training_args import PlanTrainingArgs
from nbddp.export.rewrites.record_metrics import RecordMetrics
from nbddp.export.rewrites.refuse_input import RefuseInput
from nbddp.export.rewrites.rename_trainer_tokenizer import RenameTrainerTokenizer
from nbddp.export.rewrites.replace_cuda_device import ReplaceCudaDevice
from nbddp.export.rewrites.respell_fstrings import RespellFstrings
from nbddp.export.rewrites.resume_from_checkpoint import ResumeFromCheckpoint
from nbddp.export.rewrites.run_datasets_main_process_first import RunDatasetsMainProcessFirst
from nbddp.export.rewrites.run_overrides import RunOverrides
from nbddp.export.rewrites.set_ddp_training_args import SetDdpTrainingArgs
from nbddp.export.rewrites.show_cell_result import ShowCellResult
from nbddp.export.rewrites.start_processes_once import StartProcessesOnce
from nbddp.export.rewrites.use_tqdm_auto import UseTqdmAuto
from nbddp.export.rewrites.warn_own_training_loop import WarnOwnTrainingLoop
from nbddp.export.rewrites.warn_remote_generation import WarnRemoteGeneration

# First the f-strings respelled for an exporting Python older than 3.12 (export/syntax.py let the cell through
# because this rewrite makes it valid), so the later rewrites and the script hold code that Python compiles; then
# the refusal; the process setup dropped before replace-cuda-device makes `set_device(torch.device("cuda"))`
# a `set_device(ddp.device)`; argument-level rewrites, and the cell's last value shown (while it is still the cell's
# last top-level statement); then the ones that move statements into blocks: a whole-cell guard before the
# per-statement ones, which leave code under `if ddp.is_main_process:` alone; last the warnings, which change nothing
# and pass over code that now runs on the main process only.
REWRITES: list[type[Rewrite]] = [
    RespellFstrings,
    RefuseInput,
    HoistUnslothImport,
    UseTqdmAuto,
    DropProcessSetup,
    StartProcessesOnce,
    InjectDeviceMap,
    ReplaceCudaDevice,
    SetDdpTrainingArgs,
    RunOverrides,
    PlanTrainingArgs,
    RecordMetrics,
    RenameTrainerTokenizer,
    ResumeFromCheckpoint,
    ShowCellResult,
    GuardInferenceCell,
    RunDatasetsMainProcessFirst,
    GuardRank0SideEffects,
    WarnRemoteGeneration,
    WarnOwnTrainingLoop,
]


def catalogue() -> list[tuple[str, str]]:
    """(name, description) of every rewrite, in the order export applies them: magics first."""
    return [(rewrite.NAME, rewrite.DESCRIPTION) for rewrite in (ConvertMagics, *REWRITES)]


def apply(source: str, location: CellLocation, context: ExportContext = ExportContext()) -> tuple[str, list[Change]]:
    """Rewrite one code cell's raw source; returns the new source and the changes made, in order."""
    module, changes = convert_cell(source, location, context)
    cell_lines = list(range(1, len(source.splitlines()) + 1))
    origins = _follow_lines(source, module.code, cell_lines)  # the cell line each line of `module` came from
    for rewrite_class in REWRITES:
        rewrite = rewrite_class(location, context)
        rewritten = MetadataWrapper(module).visit(rewrite)
        changes += [_moved(change, origins) for change in rewrite.changes]
        origins = _follow_lines(module.code, rewritten.code, origins)
        module = rewritten
    return module.code, changes


def _moved(change: Change, origins: list[int | None]) -> Change:
    """`change` at the cell line its line came from (the nearest one above, for a line nbddp wrote)."""
    known = [origin for origin in origins[: change.line] if origin is not None]
    line = known[-1] if known else next((origin for origin in origins if origin is not None), change.line)
    return Change(change.rewrite, change.location, line, change.message)


def _follow_lines(old: str, new: str, origins: list[int | None]) -> list[int | None]:
    """The origin of each line of `new`, given those of `old` (difflib alignment on stripped lines)."""
    old_lines = [line.strip() for line in old.splitlines()]
    new_lines = [line.strip() for line in new.splitlines()]
    followed: list[int | None] = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            followed += [None] * (j2 - j1)
        elif tag != "delete":  # equal, or replace: line k of the block came from line k (or the block's last)
            followed += [origins[min(i1 + k, i2 - 1)] for k in range(j2 - j1)]
    return followed
