/**
 * The status-bar item: "GPU ×1 · host-2" while a cell of the current notebook's kernel holds
 * GPUs, "waiting for GPU" while a cell waits for them, "no GPU" otherwise; then " · 2 jobs" while
 * background jobs this kernel submitted are queued or running. Hidden when the current
 * notebook's kernel is not a kernelfleet kernel. Clicking it opens the fleet panel.
 */
import { Widget } from '@lumino/widgets';

import { count, gpuStatus } from './format';
import { FleetPanelModel } from './model';

export class GpuStatusItem extends Widget {
  constructor(
    private readonly _model: FleetPanelModel,
    openPanel: () => void
  ) {
    super();
    this.addClass('jp-KernelfleetStatus');
    this.node.title = 'kernelfleet: GPUs of this notebook’s kernel (click for the fleet panel)';
    this.node.addEventListener('click', openPanel);
    _model.changed.connect(() => this.update());
    this.update();
  }

  /** Shown only for a kernelfleet kernel. */
  get active(): boolean {
    return this._model.state === 'ready' || this._model.state === 'unreachable';
  }

  protected onUpdateRequest(): void {
    const model = this._model;
    const held = model.kernel?.gpus_held ?? [];
    const jobs = model.activeJobs;
    const text =
      model.state === 'unreachable' ? 'gateway unreachable' : gpuStatus(held, model.waiting) +
        (jobs ? ` · ${count(jobs, 'job')}` : '');
    this.node.textContent = text;
    this.node.dataset.state = held.length ? 'gpu' : model.waiting ? 'waiting' : 'idle';
  }
}
