"""Reports: tables, progress, and (with the simulator) plots and traces."""
