"""Process plumbing: the device, dtype and compile choice (devices), CPU threads (threads),
processes under torchrun or SLURM (distributed), clean stops on signals (preemption), the run
directory's lock (runlock) and atomic file writes (io). Nothing is imported here: a command that
only composes its settings must not pay for torch."""
