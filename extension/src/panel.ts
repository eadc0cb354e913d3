/**
 * The right-sidebar fleet panel: this notebook's kernel (replicas with host and state, the
 * executor, whether it is degraded and why, GPUs bound now and where, recent cells' start
 * delays and why they waited) and the
 * fleet (hosts' GPUs committed / subscribed / total and each device's use: a cell's, lent to a
 * background job, or free; the autoscaler's last decision), the background jobs (state, progress,
 * GPUs and lease, preemptions, a failed job's log tail), then the sections of other tools. It renders whatever `FleetPanelModel` holds, whenever it changes.
 */
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IFleetModel, IHostModel, IJob, IJobsModel, IKernelModel, ISection } from './api';
import { h, note, section, table } from './dom';
import {
  cellText,
  count,
  degradedText,
  deviceTitle,
  deviceUses,
  gpus,
  gpusHeldText,
  isActiveJob,
  jobGpusText,
  jobProgress,
  jobProgressText,
  preemptionsText,
  waitingText
} from './format';
import { FleetPanelModel } from './model';

export const fleetIcon = new LabIcon({
  name: 'kernelfleet:fleet',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="2" y="4" width="20" height="4" rx="1"/><rect x="2" y="10" width="20" height="4" rx="1"/>' +
    '<rect x="2" y="16" width="20" height="4" rx="1"/></g></svg>'
});

const RECENT_CELLS = 5;
/** Finished jobs shown below the active ones, newest first. */
const FINISHED_JOBS = 3;
const LOG_TAIL_LINES = 8;

export class FleetPanel extends Widget {
  constructor(private readonly _model: FleetPanelModel) {
    super();
    this.id = 'kernelfleet-panel';
    this.addClass('jp-KernelfleetPanel');
    this.title.icon = fleetIcon;
    this.title.caption = 'Kernelfleet: this notebook’s kernel and the fleet';
    _model.changed.connect(() => this.update());
    this.update();
  }

  protected onUpdateRequest(): void {
    const model = this._model;
    const live = model.live ? 'live' : 'connecting…';
    this.node.replaceChildren(
      h('header', 'jp-KernelfleetPanel-header', h('h2', '', 'Kernelfleet'),
        h('span', `jp-KernelfleetPanel-live${model.live ? ' jp-mod-live' : ''}`, live)),
      ...this._body()
    );
  }

  private _body(): HTMLElement[] {
    const model = this._model;
    switch (model.state) {
      case 'unreachable':
        return [
          note('gateway unreachable', 'jp-KernelfleetPanel-error'),
          note(model.error),
          note('Retrying by itself; this panel recovers when the gateway answers again.')
        ];
      case 'not-kernelfleet':
        return [
          note('not a kernelfleet kernel', 'jp-KernelfleetPanel-warning'),
          note(model.error),
          ...(model.fleet ? [fleetSection(model.fleet, model.lastAutoscalerEvent)] : [])
        ];
      case 'no-kernel':
        return [
          note('Open a notebook to see its kernel on the fleet.'),
          ...(model.fleet ? [fleetSection(model.fleet, model.lastAutoscalerEvent)] : []),
          ...(model.fleet?.jobs ? [jobsSection(model.fleet.jobs, null)] : []),
          ...model.sections.map(toolSection)
        ];
      case 'ready':
        return [
          ...(model.kernel ? [kernelSection(model.kernel, model)] : []),
          ...(model.fleet ? [fleetSection(model.fleet, model.lastAutoscalerEvent)] : []),
          ...(model.fleet?.jobs ? [jobsSection(model.fleet.jobs, model.kernelId)] : []),
          ...model.sections.map(toolSection)
        ];
    }
  }
}

function kernelSection(kernel: IKernelModel, model: FleetPanelModel): HTMLElement {
  const held = kernel.gpus_held ?? [];
  const prefix = `${kernel.id.slice(0, 8)}-`; // replica ids start with their kernel's
  // The executor is a badge by its replica's id, not a column of its own: four columns of
  // words that do not wrap are wider than the sidebar.
  const replicas = kernel.replicas.map(r => [
    h('span', '',
      h('span', 'jp-KernelfleetPanel-id', r.id.startsWith(prefix) ? r.id.slice(prefix.length) : r.id),
      r.id === kernel.executor ? ' ' : null,
      r.id === kernel.executor ? h('span', 'jp-KernelfleetPanel-badge', 'executor') : null),
    r.host,
    h('span', `jp-KernelfleetPanel-state jp-mod-${r.state}`, r.state)
  ]);
  const cells = (kernel.recent_cells ?? []).slice(-RECENT_CELLS).reverse();
  return section(
    'This notebook’s kernel',
    h('dl', 'jp-KernelfleetPanel-facts',
      h('dt', '', 'kernel'), h('dd', '', `${kernel.name} · ${kernel.id.slice(0, 8)}`),
      h('dt', '', 'GPUs now'),
      h('dd', 'jp-KernelfleetPanel-gpus', held.length ? gpusHeldText(held) : 'none'),
      h('dt', '', 'per cell'),
      h('dd', '', kernel.gpus === undefined ? '–' : `${gpus(kernel.gpus)} by default`)),
    kernel.degraded
      ? note(degradedText(kernel.degraded), 'jp-KernelfleetPanel-warning jp-KernelfleetPanel-degraded')
      : null,
    model.waiting ? note(waitingText(model.waiting), 'jp-KernelfleetPanel-waiting') : null,
    table(['replica', 'host', 'state'], replicas, 'jp-KernelfleetPanel-replicas'),
    cells.length
      ? h('div', 'jp-KernelfleetPanel-cells', h('h4', '', 'Recent cells (newest first)'),
          h('ol', '', ...cells.map(c => h('li', '', cellText(c)))))
      : null
  );
}

function fleetSection(fleet: IFleetModel, autoscalerEvent: string | null): HTMLElement {
  const summary = fleet.fleet;
  const hosts = fleet.hosts.map(host => [
    host.id,
    h('span', `jp-KernelfleetPanel-state jp-mod-${host.state}`, host.state),
    h('span', '', `${host.gpus.committed} / ${host.gpus.subscribed} / ${host.gpus.total}`,
      deviceGrid(host))
  ]);
  const jobs = summary.jobs;
  const last = autoscalerEvent ?? summary.autoscaling?.last_round?.decision ?? null;
  const autoscaler = summary.autoscaling
    ? `last decision: ${last ?? 'none yet'}`
    : 'not running';
  return section(
    'Fleet',
    note(`${summary.policy} policy · ${count(summary.kernels, 'kernel')} · GPUs ${summary.gpus.committed} / ` +
      `${summary.gpus.subscribed} / ${summary.gpus.total}`),
    table(['host', 'state', 'GPUs'], hosts, 'jp-KernelfleetPanel-hosts'),
    note('GPUs: committed (bound to running cells) / subscribed (replicas placed) / total',
      'jp-KernelfleetPanel-legend'),
    deviceLegend(fleet.hosts),
    jobs
      ? note(`Jobs: ${jobs.queued} queued · ${jobs.running} running · ${gpus(jobs.gpus_lent)} lent`,
          'jp-KernelfleetPanel-jobsline')
      : null,
    note(`Autoscaler: ${autoscaler}`, 'jp-KernelfleetPanel-autoscaler')
  );
}

/** One square per device: a cell's, lent to a job (its id on hover), or free. */
function deviceGrid(host: IHostModel): HTMLElement | null {
  const uses = deviceUses(host);
  if (!uses.length) {
    return null;
  }
  return h('span', 'jp-KernelfleetPanel-devices', ...uses.map(device => {
    const square = h('span', `jp-KernelfleetPanel-device jp-mod-${device.use}`);
    square.title = deviceTitle(device);
    square.dataset.device = device.id;
    return square;
  }));
}

/** The squares' key: which uses the hosts' devices show. */
function deviceLegend(hosts: IHostModel[]): HTMLElement | null {
  const uses = new Set(hosts.flatMap(host => deviceUses(host).map(device => device.use)));
  const labels = { cell: 'a cell’s', job: 'lent to a job', free: 'free', other: 'not lent' };
  const shown = (['cell', 'job', 'free', 'other'] as const).filter(use => uses.has(use));
  if (!shown.length) {
    return null;
  }
  return h('p', 'jp-KernelfleetPanel-note jp-KernelfleetPanel-legend', 'Devices: ',
    ...shown.map(use =>
      h('span', '', h('span', `jp-KernelfleetPanel-device jp-mod-${use}`), ` ${labels[use]} `)));
}

/** The background jobs: the active ones (this kernel's first), then the last few finished. */
function jobsSection(model: IJobsModel, kernelId: string | null): HTMLElement {
  const newestFirst = [...model.jobs].reverse();
  const mine = (job: IJob) => (job.owner_kernel !== null && job.owner_kernel === kernelId ? 0 : 1);
  const active = newestFirst.filter(isActiveJob).sort((a, b) => mine(a) - mine(b));
  const finished = newestFirst.filter(job => !isActiveJob(job)).slice(0, FINISHED_JOBS);
  const shown = [...active, ...finished];
  return section(
    'Jobs',
    note(`${model.policy} policy · ${count(active.length, 'active job')}`),
    shown.length
      ? h('ul', 'jp-KernelfleetPanel-jobs', ...shown.map(job => jobItem(job, kernelId)))
      : note('No background jobs: %schedule submit SCRIPT --gpus N --steps N queues one.')
  );
}

function jobItem(job: IJob, kernelId: string | null): HTMLElement {
  const bar = h('span', 'jp-KernelfleetPanel-bar', h('span', 'jp-KernelfleetPanel-barFill'));
  (bar.firstChild as HTMLElement).style.width = `${Math.round(jobProgress(job) * 100)}%`;
  const preempted = preemptionsText(job);
  const failed = job.state === 'failed';
  return h('li', `jp-KernelfleetPanel-job jp-mod-${job.state}`,
    h('div', 'jp-KernelfleetPanel-jobHead',
      h('span', 'jp-KernelfleetPanel-jobName', job.name),
      ' ',
      h('span', 'jp-KernelfleetPanel-id', job.id),
      job.owner_kernel !== null && job.owner_kernel === kernelId
        ? h('span', 'jp-KernelfleetPanel-badge', 'this kernel') : null,
      ' ',
      h('span', `jp-KernelfleetPanel-state jp-mod-${job.state}`, job.state)),
    h('div', 'jp-KernelfleetPanel-jobProgress', bar, jobProgressText(job)),
    h('div', 'jp-KernelfleetPanel-note', jobGpusText(job), preempted ? ` · ${preempted}` : ''),
    failed && job.error
      ? note(job.error.split('\n')[0], 'jp-KernelfleetPanel-error') : null,
    failed && job.log_tail.length
      ? h('pre', 'jp-KernelfleetPanel-log', job.log_tail.slice(-LOG_TAIL_LINES).join('\n')) : null);
}

function toolSection(tool: ISection): HTMLElement {
  const rows = tool.rows.map(row => [row.label, row.value]);
  return section(
    tool.title,
    tool.error ? note(tool.error, 'jp-KernelfleetPanel-error') : null,
    rows.length ? table(['', ''], rows, 'jp-KernelfleetPanel-tool') : null,
    tool.text ? note(tool.text) : null
  );
}
