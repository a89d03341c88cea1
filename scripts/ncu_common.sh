# Sourced by the ncu_*.sh scripts: the Nsight Compute sections they collect.
NCU_SECTIONS=(--section SpeedOfLight --section Occupancy --section WarpStateStats
  --section InstructionStats --section LaunchStats --section MemoryWorkloadAnalysis
  --section SchedulerStats)
