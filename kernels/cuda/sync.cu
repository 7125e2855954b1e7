// Synchronisation between the processes of one run (hw/src/processes/): before every timed
// launch each process's stream passes this barrier, so that the launch skew between processes
// is not part of any process's CUDA-event time, and every rank's host-side counter resets and
// poisoning (issued before the barrier on the same stream) are done before any peer writes.
#include "common.cuh"

// One thread counts this stream in on the shared counter (process 0's memory, mapped into the
// others through CUDA IPC; system scope: the writers are other processes) and waits until
// `target` arrivals are in. The counter only grows: barrier e waits for e × participants.
extern "C" __global__ void process_barrier(int* counter, int target, u64 timeout_ns,
                                           ErrorRecord* err, int rank) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    __threadfence_system();
    asm volatile("red.release.sys.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
    const u64 t0 = globaltimer_ns();
    int seen;
    while ((seen = ld_acquire_sys(counter)) < target) {
        if (globaltimer_ns() - t0 > timeout_ns) {
            record_timeout(err, WAIT_PROCESS_BARRIER, rank, -1, -1, -1, target, seen);
            break;
        }
    }
}

// A straggler's late start (hw/src/faults/): queued on the rank's stream after the barrier
// above and before its timed launch, one thread waits `delay_ns` of %globaltimer, so the
// rank's kernel starts that much after its peers' and its own CUDA-event time leaves it out.
extern "C" __global__ void fault_delay(u64 delay_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const u64 t0 = globaltimer_ns();
    while (globaltimer_ns() - t0 < delay_ns) {
    }
}
