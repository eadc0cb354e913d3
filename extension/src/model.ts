/**
 * What the panel and the status bar show, kept live.
 *
 * One `FleetPanelModel` per JupyterLab window. It follows the current notebook's kernel
 * (`kernelId`), listens to the event stream, and re-fetches the kernel model, the fleet and the
 * other tools' sections when an event concerns them (coalesced: one fetch per burst of events).
 * Without the stream (before the gateway has event routes, or while it reconnects) it re-fetches
 * on each reconnection attempt instead.
 *
 * `state` is one of:
 * - `no-kernel`: the current widget is no notebook with a kernel;
 * - `not-kernelfleet`: the kernel does not run on a kernelfleet (server not in gateway mode, or
 *   the gateway does not know it as a fleet kernel);
 * - `unreachable`: the gateway does not answer (`error` names its URL); recovers by itself;
 * - `ready`: `kernel` and `fleet` are current.
 *
 * The fleet includes the background jobs; while one is queued or running the model also
 * refreshes every few seconds, since a job's progress changes its record without an event.
 */
import { ISignal, Signal } from '@lumino/signaling';

import {
  IFleetEvent,
  IFleetModel,
  IKernelModel,
  ISection,
  PanelApiError,
  getJson
} from './api';
import { EventStream } from './events';
import { isActiveJob } from './format';

export type PanelState = 'no-kernel' | 'not-kernelfleet' | 'unreachable' | 'ready';

/** A cell of this kernel waiting for GPUs: from its latest `cell-waiting` event, or the
 * kernel model's `waiting` when the panel refreshes. */
export interface IWaiting {
  gpus: number;
  reason: string;
  cellsAhead: number;
}

/** Events within this many ms of each other cause one refresh. */
const COALESCE_MS = 100;
/** At most one refresh per this many ms: a kernel running many short cells must not make the
 * panel fetch per cell (what it shows still changes within a second or two). */
const MIN_REFRESH_INTERVAL_MS = 1000;
/** While a background job is queued or running, refresh this often: a job's progress reports
 * change its record without an event. */
const JOBS_POLL_MS = 5000;
const KERNEL_EVENTS = new Set([
  'kernel-started', 'kernel-stopped', 'cell-queued', 'cell-waiting', 'cell-started',
  'cell-finished', 'gpus-committed', 'gpus-released', 'replica-lost', 'replica-replaced',
  'replica-migrated', 'kernel-degraded', 'kernel-repaired'
]);

export class FleetPanelModel {
  constructor() {
    this._stream.received.connect((_, event) => this._onEvent(event));
    this._stream.connectionChanged.connect((_, connected) => {
      this._live = connected;
      this._scheduleRefresh();
    });
    this._stream.start();
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get state(): PanelState {
    return this._state;
  }
  get error(): string {
    return this._error;
  }
  get kernelId(): string | null {
    return this._kernelId;
  }
  get kernel(): IKernelModel | null {
    return this._kernel;
  }
  get fleet(): IFleetModel | null {
    return this._fleet;
  }
  get sections(): ISection[] {
    return this._sections;
  }
  get waiting(): IWaiting | null {
    return this._waiting;
  }
  /** The autoscaler's latest decision seen on the stream, as `action: reason`. */
  get lastAutoscalerEvent(): string | null {
    return this._autoscalerEvent;
  }
  /** Whether the event stream is open (changes show as they happen). */
  get live(): boolean {
    return this._live;
  }

  /** Follow another kernel (`null`: no notebook kernel). */
  setKernel(kernelId: string | null): void {
    if (kernelId === this._kernelId) {
      return;
    }
    this._kernelId = kernelId;
    this._kernel = null;
    this._waiting = null;
    this._sections = [];
    this._state = kernelId === null ? 'no-kernel' : this._state;
    this._changed.emit();
    this._scheduleRefresh();
  }

  /** Fetch everything now (also what a reconnecting stream does). */
  async refresh(): Promise<void> {
    const kernelId = this._kernelId;
    try {
      const fleet = getJson<IFleetModel>('fleet');
      const kernel = kernelId ? getJson<IKernelModel>(`kernels/${kernelId}`) : null;
      const sections = getJson<ISection[]>('sections', kernelId ? { kernel: kernelId } : {});
      this._fleet = await fleet;
      if (kernelId !== this._kernelId) {
        return; // the notebook changed meanwhile: its own refresh is under way
      }
      this._kernel = kernel ? await kernel : null;
      this._sections = await sections.catch(() => []);
      const waiting = this._kernel?.waiting;
      if (waiting) {
        // the gateway's word, whatever events this page missed (a reconnect, a tab switch)
        this._waiting = {
          gpus: waiting.gpus,
          reason: waiting.reason,
          cellsAhead: waiting.cells_ahead
        };
      } else if (this._kernel && (waiting === null || !this._queued())) {
        this._waiting = null;
      }
      this._state = kernelId === null ? 'no-kernel' : 'ready';
      this._error = '';
      this._pollWhileJobsRun();
    } catch (error) {
      if (kernelId !== this._kernelId) {
        return;
      }
      const reason = error instanceof PanelApiError ? error.reason : 'error';
      if (reason === 'not-kernelfleet' || reason === 'not-found') {
        this._state = 'not-kernelfleet';
        this._kernel = null;
      } else {
        this._state = 'unreachable';
      }
      this._error = error instanceof Error ? error.message : String(error);
    }
    this._changed.emit();
  }

  /** This kernel's jobs that are not over (queued, running, stopping). */
  get activeJobs(): number {
    const jobs = this._fleet?.jobs?.jobs ?? [];
    return jobs.filter(job => job.owner_kernel === this._kernelId && isActiveJob(job)).length;
  }

  dispose(): void {
    this._stream.dispose();
    window.clearTimeout(this._timer);
    window.clearTimeout(this._jobsTimer);
  }

  private _pollWhileJobsRun(): void {
    window.clearTimeout(this._jobsTimer);
    if ((this._fleet?.jobs?.jobs ?? []).some(isActiveJob)) {
      this._jobsTimer = window.setTimeout(() => this._scheduleRefresh(), JOBS_POLL_MS);
    }
  }

  private _queued(): number {
    return this._kernel?.queued_cells ?? 0;
  }

  private _onEvent(event: IFleetEvent): void {
    const ours = event.kernel_id !== null && event.kernel_id === this._kernelId;
    if (ours) {
      if (event.type === 'cell-waiting') {
        this._waiting = {
          gpus: Number(event.data.gpus ?? 0),
          reason: String(event.data.reason ?? ''),
          cellsAhead: Number(event.data.cells_ahead ?? 0)
        };
        this._changed.emit();
      } else if (event.type === 'cell-started' || event.type === 'cell-finished') {
        this._waiting = null;
        this._changed.emit();
      } else if (event.type === 'gpus-committed' || event.type === 'gpus-released') {
        this._applyGpus(event);
      }
    }
    if (event.type === 'autoscaler-decision') {
      const reason = event.data.reason ? `: ${event.data.reason}` : '';
      this._autoscalerEvent = `${event.data.action ?? 'decision'}${reason}`;
    }
    // Another kernel's events change only the hosts' GPU counts: refresh for those too.
    if (ours || event.kernel_id === null || !KERNEL_EVENTS.has(event.type) ||
        event.type.startsWith('gpus-')) {
      this._scheduleRefresh();
    }
  }

  /** Show GPUs bound or released at once, from the event (a refresh follows, throttled). */
  private _applyGpus(event: IFleetEvent): void {
    if (!this._kernel || !event.host_id) {
      return;
    }
    const devices = (event.data.devices as string[] | undefined) ?? [];
    const others = (this._kernel.gpus_held ?? []).filter(held => held.host !== event.host_id);
    const mine = (this._kernel.gpus_held ?? []).find(held => held.host === event.host_id);
    const now = new Set(mine?.devices ?? []);
    for (const device of devices) {
      if (event.type === 'gpus-committed') {
        now.add(device);
      } else {
        now.delete(device);
      }
    }
    this._kernel = {
      ...this._kernel,
      gpus_held: now.size ? [...others, { host: event.host_id, devices: [...now] }] : others
    };
    this._changed.emit();
  }

  private _scheduleRefresh(): void {
    if (this._timer) {
      return;
    }
    const sinceLast = Date.now() - this._lastRefresh;
    const delay = Math.max(COALESCE_MS, MIN_REFRESH_INTERVAL_MS - sinceLast);
    this._timer = window.setTimeout(() => {
      this._timer = 0;
      this._lastRefresh = Date.now();
      void this.refresh();
    }, delay);
  }

  private _stream = new EventStream();
  private _state: PanelState = 'no-kernel';
  private _error = '';
  private _kernelId: string | null = null;
  private _kernel: IKernelModel | null = null;
  private _fleet: IFleetModel | null = null;
  private _sections: ISection[] = [];
  private _waiting: IWaiting | null = null;
  private _autoscalerEvent: string | null = null;
  private _live = false;
  private _timer = 0;
  private _jobsTimer = 0;
  private _lastRefresh = 0;
  private _changed = new Signal<this, void>(this);
}
