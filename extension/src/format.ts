/** The words the panel and the status bar use, in one place. */
import { IDegradedModel, IGpusHeld, IRecentCell } from './api';
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
