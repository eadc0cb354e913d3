/**
 * The right-sidebar fleet panel: this notebook's kernel (replicas with host and state, the
 * executor, whether it is degraded and why, GPUs bound now and where, recent cells' start
 * delays and why they waited) and the
 * fleet (hosts' GPUs committed / subscribed / total, the autoscaler's last decision), then the
 * sections of other tools. It renders whatever `FleetPanelModel` holds, whenever it changes.
 */
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IFleetModel, IKernelModel, ISection } from './api';
import { h, note, section, table } from './dom';
import { cellText, count, degradedText, gpus, gpusHeldText, waitingText } from './format';
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
          ...model.sections.map(toolSection)
        ];
      case 'ready':
        return [
          ...(model.kernel ? [kernelSection(model.kernel, model)] : []),
          ...(model.fleet ? [fleetSection(model.fleet, model.lastAutoscalerEvent)] : []),
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
    `${host.gpus.committed} / ${host.gpus.subscribed} / ${host.gpus.total}`
  ]);
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
    note(`Autoscaler: ${autoscaler}`, 'jp-KernelfleetPanel-autoscaler')
  );
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
