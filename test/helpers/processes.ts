// Which processes are children of a process, from /proc (Linux): how a test sees that a child it
// never held a handle to (the gateway's simulated fleet) was started, and that it has gone.
import { readdirSync, readFileSync } from 'node:fs';

export function childPids(parent: number = process.pid): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue; // gone while we looked
    }
    // pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[1]) === parent) out.push(Number(name));
  }
  return out;
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie still answers signal 0 until reaped: count it as gone.
  try {
    return !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
  } catch {
    return false;
  }
}
