"""Analyses the passes share: they read IR and compute facts about it.

`liveness` (step order, flow windows, segment holds, interference),
`coloring` (colouring the interference graph), `segmenting` (cutting core
class tables into segments, a class's segment IR, splits), `balance` (sends
and receives pairing up per flow and class) and `segment_check` (the proof
`check-segments` runs). The passes in
`meshrt.passes` are thin `ModulePass`es over them.
"""
