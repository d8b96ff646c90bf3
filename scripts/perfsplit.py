#!/usr/bin/env python3
"""Charge a `perf record -a -g` profile to the processes of one server.

Every sandbox process is named runsc (or exe), so perf's own --sort comm
cannot tell the server, its gVisor workers, the sandboxes and their systrap
stubs apart. This walks perf's fork events from the server's PID and names
each process by its ancestry (agentenv/exe/runsc = a sandbox process,
agentenv/exe/runsc/runsc/runsc/runsc = its stubs, other:* = not the server's).

  perf record -a -g -F 1999 -o DATA -- <workload>
  scripts/perfsplit.py tree DATA SERVER_PID            samples per kind of process
  scripts/perfsplit.py cats DATA SERVER_PID KIND NAME=FRAME[,FRAME..] ...
                                                        samples of KIND by the first category
                                                        whose frame is on the stack
  scripts/perfsplit.py under DATA SERVER_PID KIND FUNC [DEPTH]
                                                        samples of KIND under FUNC, by callee chain

At -F 1999 a sample is 0.5 ms of CPU. Used for docs/design.md, "CPU outside
the sandbox's own processes", and the CPU split in docs/benchmarks.md.
"""
import collections
import re
import subprocess
import sys

FORK = re.compile(r'PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)')
COMM = re.compile(r'PERF_RECORD_COMM(?: exec)?: (.*):(\d+)/(\d+)')


def processes(data):
    """Returns parent and comm of every process, and samples per pid."""
    out = subprocess.run(['perf', 'script', '-i', data, '--show-task-events', '-F', 'comm,pid,tid,time'],
                         capture_output=True, text=True).stdout
    parent, comm, samples = {}, {}, collections.Counter()
    for line in out.splitlines():
        m = FORK.search(line)
        if m:
            pid, tid, ppid, _ = map(int, m.groups())
            if pid == tid:
                parent.setdefault(pid, ppid)
            continue
        m = COMM.search(line)
        if m:
            if m.group(2) == m.group(3):
                comm[int(m.group(2))] = m.group(1)
            continue
        parts = line.split()
        if len(parts) >= 3 and '/' in parts[-2]:
            pid = int(parts[-2].split('/')[0])
            samples[pid] += 1
            comm.setdefault(pid, parts[0])
    return parent, comm, samples


def kind(pid, root, parent, comm):
    chain = [pid]
    while chain[-1] in parent and chain[-1] != 0 and len(chain) < 20:
        chain.append(parent[chain[-1]])
    if root not in chain:
        return 'other:' + comm.get(pid, '?')
    return '/'.join(comm.get(p, '?') for p in reversed(chain[:chain.index(root) + 1]))


def stacks(data, pids):
    """Yields each sample's stack (leaf first) of the given pids."""
    out = subprocess.run(['perf', 'script', '-i', data, '-F', 'pid,ip,sym'], capture_output=True, text=True).stdout
    cur, stack = None, []
    for line in out.splitlines() + ['']:
        if not line.strip():
            if cur in pids:
                yield stack
            cur, stack = None, []
            continue
        parts = line.split()
        if cur is None and parts[0].isdigit():
            cur = int(parts[0])
            continue
        p = line.strip().split(None, 1)
        if len(p) == 2:
            stack.append(p[1].rsplit(' (', 1)[0].split('+0x')[0])


def main():
    cmd, data, root = sys.argv[1], sys.argv[2], int(sys.argv[3])
    parent, comm, samples = processes(data)
    kinds = collections.Counter()
    for pid, n in samples.items():
        kinds[kind(pid, root, parent, comm)] += n
    if cmd == 'tree':
        for k, n in kinds.most_common(30):
            print(f'{n:7d} {k}')
        return
    want = sys.argv[4]
    pids = {p for p in samples if kind(p, root, parent, comm) == want}
    counts, total = collections.Counter(), 0
    if cmd == 'cats':
        cats = [a.split('=', 1) for a in sys.argv[5:]]
        for st in stacks(data, pids):
            total += 1
            joined = '|'.join(st)
            name = next((n for n, pat in cats if any(f in joined for f in pat.split(','))), None)
            counts[name or 'other: ' + (st[-1] if st else '?')[:60]] += 1
    elif cmd == 'under':
        func, depth = sys.argv[5], int(sys.argv[6]) if len(sys.argv) > 6 else 1
        for st in stacks(data, pids):
            total += 1
            if func in st:
                i = st.index(func)
                counts[' <- '.join(reversed(st[max(0, i - depth):i])) or '(self)'] += 1
    print(f'{total} samples of {want}')
    for k, n in counts.most_common(30):
        print(f'{n:7d} {100 * n / max(total, 1):5.1f}% {k}')


if __name__ == '__main__':
    main()
