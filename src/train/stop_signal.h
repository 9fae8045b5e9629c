// Stopping a run cleanly on a signal. SIGINT (Ctrl-C), SIGTERM (kill, a scheduler preempting the
// job) and SIGUSR1 (Slurm's warning before the time limit, sbatch --signal) ask the trainer to
// write a checkpoint after the update it is in and return (TrainerSetup::stop_signal); the run
// then continues with --resume. A second SIGINT or SIGTERM a second or more after the first ends
// the process at once, as the signal would have without this (the last complete checkpoint stays
// intact either way). Copies of one signal that arrive together (a terminal's Ctrl-C reaches
// every worker and the launcher, which forwards it) count as one.
#pragma once

namespace ska::train {

// Until defer_stop_signals() is called (when training begins) the signals keep their default
// action: a run being set up (reading data, meeting its peers) has nothing to save, and may be
// waiting for something that never comes.
//
// Installs the handling for the process: the three signals are blocked in the calling thread,
// so that every thread it starts afterwards inherits the block and no system call of ours is
// interrupted, and one thread waits for them. Call it from main before starting other threads;
// not in a launcher whose children must receive the signals' default actions. `announce`: say on
// stderr that the run is stopping (one worker of a job says it for all). A signal this process
// inherited as ignored stays ignored. Idempotent.
void watch_stop_signals(bool announce = true);

// From now on the signals ask for a clean stop (stop_signal_received) instead of ending the process.
void defer_stop_signals();

// The first of the signals received since defer_stop_signals (SIGINT, SIGTERM or SIGUSR1), or 0.
int stop_signal_received();

// "SIGINT", "SIGTERM", "SIGUSR1" or "signal N".
const char* stop_signal_name(int sig);

// Ends the process by `sig` with its default action, once the caller has cleaned up after the
// stop it asked for: a shell that ran the program then sees it was interrupted and stops too
// (as it would not for a plain exit(130)).
[[noreturn]] void end_by_signal(int sig);

}  // namespace ska::train
