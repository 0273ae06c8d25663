"""Tasks that local-pool test scripts send to their workers (imported by name in each worker)."""


def matmul_threads(seed: int) -> int:
    """A parallel region on two threads: it deadlocked in a child forked after the parent's."""
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    return int(torch.rand(300, 300).matmul(torch.rand(300, 300)).sum().item() > 0)


def start_a_child(_: int) -> tuple[str, bool, int]:
    """A task that starts a process of its own (a stage may): refused in a daemonic one."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=int)
    child.start()
    child.join()
    me = multiprocessing.current_process()
    return me.name, me.daemon, child.exitcode
