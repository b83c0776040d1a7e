"""Mesh kernel kinds, one folder each; see `interface` (what a kind answers) and
`registry` (how the folders are collected). docs/kernels.md says how to add one."""
