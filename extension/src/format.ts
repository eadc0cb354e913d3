/** The words the panel and the status bar use, in one place. */
import { IGpusHeld, IRecentCell } from './api';
import { IWaiting } from './model';

/** "GPU ×1 · host-2" while GPUs are held (hosts joined by ", "), else "no GPU". */
export function gpuStatus(held: IGpusHeld[], waiting: IWaiting | null): string {
  const count = held.reduce((n, h) => n + h.devices.length, 0);
  if (count > 0) {
    return `GPU ×${count} · ${held.map(h => h.host).join(', ')}`;
  }
  return waiting ? 'waiting for GPU' : 'no GPU';
}

export function gpus(n: number): string {
  return n === 1 ? '1 GPU' : `${n} GPUs`;
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

/** One line per recent cell: where it ran, how long it waited to start, and why. */
export function cellText(cell: IRecentCell): string {
  const where = cell.host ? ` on ${cell.host}` : '';
  const what = cell.gpus ? ` with ${gpus(cell.gpus)}` : '';
  const started =
    cell.started_at === null ? 'not started yet' : `started after ${seconds(cell.start_delay_s)}`;
  const why = [cell.waited, cell.moved_to ? `moved to ${cell.moved_to}` : null]
    .filter(Boolean)
    .join('; ');
  return `${started}${where}${what}${why ? ` — ${why}` : ''}`;
}
