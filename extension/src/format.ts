/** The words the panel and the status bar use, in one place. */
import { IDegradedModel, IGpusHeld, IHostModel, IJob, IRecentCell } from './api';
import { IWaiting } from './model';

/** "GPU ×1 · host-2" while GPUs are held (hosts joined by ", "), else "no GPU". */
export function gpuStatus(held: IGpusHeld[], waiting: IWaiting | null): string {
  const count = held.reduce((n, h) => n + h.devices.length, 0);
  if (count > 0) {
    return `GPU ×${count} · ${held.map(h => h.host).join(', ')}`;
  }
  return waiting ? 'waiting for GPU' : 'no GPU';
}

/** "1 kernel", "2 kernels". */
export function count(n: number, noun: string): string {
  return n === 1 ? `1 ${noun}` : `${n} ${noun}s`;
}

export function gpus(n: number): string {
  return count(n, 'GPU');
}

/** "1 GPU on host-2 (device 0)", one such part per host, joined by "; ". */
export function gpusHeldText(held: IGpusHeld[]): string {
  return held
    .map(g => {
      const which = g.devices.length === 1 ? 'device' : 'devices';
      return `${gpus(g.devices.length)} on ${g.host} (${which} ${g.devices.join(', ')})`;
    })
    .join('; ');
}

export function seconds(s: number | null | undefined): string {
  return s === null || s === undefined ? '–' : `${s.toFixed(1)} s`;
}

/** "waiting for 1 GPU (3 cells ahead)", with the gateway's reason when it gives one. */
export function waitingText(waiting: IWaiting): string {
  const ahead =
    waiting.cellsAhead > 0
      ? ` (${waiting.cellsAhead} ${waiting.cellsAhead === 1 ? 'cell' : 'cells'} ahead)`
      : '';
  const reason = waiting.reason ? ` — ${waiting.reason}` : '';
  return `waiting for ${gpus(waiting.gpus)}${ahead}${reason}`;
}

/** One line per recent cell: how long it took to start and why ("waited 13.1 s for 1 GPU (3
 * cells ahead) · ran on host-4"; "started after 0.0 s on host-1 with 1 GPU"), and whether
 * it moved. */
export function cellText(cell: IRecentCell): string {
  if (cell.started_at === null) {
    return `not started yet${cell.gpus ? `: needs ${gpus(cell.gpus)}` : ''}`;
  }
  const moved = cell.moved_to ? `; moved to ${cell.moved_to}` : '';
  if (cell.waited) {
    return `${cell.waited}${moved}${cell.host ? ` · ran on ${cell.host}` : ''}`;
  }
  const where = cell.host ? ` on ${cell.host}` : '';
  const what = cell.gpus ? ` with ${gpus(cell.gpus)}` : '';
  return `started after ${seconds(cell.start_delay_s)}${where}${what}${moved}`;
}

/** "degraded: 2 of 3 replicas - replica … died (…); a replacement waits: …". */
export function degradedText(degraded: IDegradedModel): string {
  return `degraded: ${degraded.live_replicas} of ${degraded.wanted_replicas} replicas - ${degraded.reason}`;
}

/** States of a job that is not over: it holds, or waits for, GPUs. */
const ACTIVE_JOB_STATES = new Set(['queued', 'running', 'stopping']);

export function isActiveJob(job: IJob): boolean {
  return ACTIVE_JOB_STATES.has(job.state);
}

/** The share of its step budget a job has done, 0 to 1. */
export function jobProgress(job: IJob): number {
  return job.steps > 0 ? Math.min(1, job.steps_done / job.steps) : 0;
}

/** "2 GPUs · host-1 [0, 1]" for a job holding its lease, "2 GPUs" otherwise. */
export function jobGpusText(job: IJob): string {
  const lease = job.lease ? ` · ${job.lease.host} [${job.lease.devices.join(', ')}]` : '';
  return `${gpus(job.gpus)}${lease}`;
}

/** "45% · 9000 / 20000 steps · 12.5 steps/s". */
export function jobProgressText(job: IJob): string {
  const rate = job.lease ? job.throughput[job.lease.gpu_type] : undefined;
  const speed = rate === undefined ? '' : ` · ${rate.toPrecision(3)} steps/s`;
  return `${Math.floor(jobProgress(job) * 100)}% · ${job.steps_done} / ${job.steps} steps${speed}`;
}

/** "1 preemption (40 steps lost)", "" when never preempted. */
export function preemptionsText(job: IJob): string {
  if (!job.preemptions) {
    return '';
  }
  const lost = job.lost_steps ? ` (${job.lost_steps} steps lost)` : '';
  return `${count(job.preemptions, 'preemption')}${lost}`;
}

/** What each of a host's devices is used for now: a cell's, lent to a job, free; `other` when
 * the gateway does not say which devices cells hold (only how many), and the device is not lent. */
export interface IDeviceUse {
  id: string;
  use: 'cell' | 'job' | 'free' | 'other';
  job: string | null;
}

/** The host's devices with their use, in the host's order; empty from an older gateway. */
export function deviceUses(host: IHostModel): IDeviceUse[] {
  const committed = host.gpus.committed_devices;
  const lent = host.gpus.lent_to_job ?? {};
  return (host.gpus.devices ?? []).map(entry => {
    const id = typeof entry === 'string' ? entry : entry.id;
    const job = (typeof entry === 'string' ? null : entry.lent_to_job) ?? lent[id] ?? null;
    const use =
      committed && id in committed ? 'cell' : job ? 'job' : committed ? 'free' : 'other';
    return { id, use, job };
  });
}

/** A device's tooltip: "device 1: lent to job-1a2b3c4d". */
export function deviceTitle(device: IDeviceUse): string {
  const what = {
    cell: 'bound to a cell',
    job: `lent to ${device.job}`,
    free: 'free',
    other: 'not lent to a job'
  }[device.use];
  return `device ${device.id}: ${what}`;
}
