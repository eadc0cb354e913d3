/**
 * kernelfleet's JupyterLab extension: the fleet panel in the right sidebar and the GPU item in the
 * status bar, both following the current notebook's kernel.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { FleetPanelModel } from './model';
import { FleetPanel } from './panel';
import { GpuStatusItem } from './status';

const PLUGIN_ID = 'kernelfleet:plugin';
const OPEN_COMMAND = 'kernelfleet:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The kernelfleet panel and GPU status of the current notebook’s kernel.',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    notebooks: INotebookTracker,
    statusBar: IStatusBar | null
  ) => {
    const model = new FleetPanelModel();
    const panel = new FleetPanel(model);
    shell.add(panel, 'right', { rank: 600 });

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show the kernelfleet panel',
      execute: () => shell.activateById(panel.id)
    });

    // Follow the kernel of the notebook in front, through kernel changes and restarts.
    let followed: NotebookPanel | null = null;
    const follow = () => {
      model.setKernel(followed?.sessionContext.session?.kernel?.id ?? null);
    };
    const onCurrent = (_: unknown, current: NotebookPanel | null) => {
      followed?.sessionContext.kernelChanged.disconnect(follow);
      followed = current;
      if (current) {
        current.sessionContext.kernelChanged.connect(follow);
        void current.sessionContext.ready.then(follow);
      }
      follow();
    };
    notebooks.currentChanged.connect(onCurrent);
    onCurrent(notebooks, notebooks.currentWidget);

    if (statusBar) {
      const item = new GpuStatusItem(model, () => void app.commands.execute(OPEN_COMMAND));
      statusBar.registerStatusItem(PLUGIN_ID, {
        item,
        align: 'left',
        rank: 4,
        isActive: () => item.active,
        activeStateChanged: model.changed
      });
    }
  }
};

export default plugin;
