// RUN: sed "s|@FEW_TASKS@|%S/Inputs/few_tasks.toml|" %s | not meshrt-opt -t csl 2>&1 | filecheck %s

// A target whose task IDs stop at 7 leaves wse3 no local task ID (those are
// 8..30; 0..7 belong to the input queues' data tasks): the class that needs
// one for its event table is a located compile error.

segment.program @m target "@FEW_TASKS@" mesh 4 x 1 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 16
  // CHECK: stdin:[[# @LINE + 1]]:3: error: 'segment.core_class' op core class @s needs 1 local task IDs but wse3 on target few_tasks has 0 (activatable IDs 8..30 are reserved, system (29, 30), data-task or marker IDs)
  segment.core_class @s wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 16 meta 0
      }
    }
  }
  segment.core_class @r wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 16 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 2, 1)>
}
