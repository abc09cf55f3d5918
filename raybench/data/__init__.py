"""Data preparation beside the trial flow: synthetic xView3 scenes and their chipping.

Feeds workloads with files on disk; never calls back into sweeps or trials.
"""
