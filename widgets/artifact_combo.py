"""The one artifact picker of the GUI: a combo box listing artifacts of one kind of the open
project, newest first, each as "what it is — its id".

```
combo = ArtifactCombo()
combo.set_artifacts(project.artifacts("twin"))   # creation order, as Project.artifacts gives
combo.currentData()                              # the chosen artifact's id (None: empty list)
```
Selection: the artifact someone chose (the user in the list, or code through `select` /
`setCurrentIndex`) while it is still listed; otherwise the newest. So a twin just built or
fitted is picked without the user doing anything, and a refresh never undoes a choice. With
a `placeholder` the first row is that text (data None) and stands in for "nothing chosen"
(a picker that opens what is chosen, like the Scan page's saved scans). A change of the
chosen artifact by a refill emits `currentIndexChanged` once (unless signals are blocked).
The box is only as wide as its minimum contents: a long text loses its middle to "…" on the
box (the full text is in the list and the tooltip), so it never pushes a page wider than a
laptop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from PySide6 import QtCore, QtGui, QtWidgets

from resources.project import Artifact, printable

SEP = " — "
NAME_CHARS = 60  # a longer summary ends in "…" in the list (the tooltip has all of it)


def artifact_name(art: Artifact, limit: int = NAME_CHARS) -> str:
    """What the artifact is, for people: its summary (one line), else its kind."""
    name = " ".join(printable(art.summary).split()) or art.kind
    return name if len(name) <= limit else name[: limit - 1].rstrip() + "…"


def artifact_text(art: Artifact) -> str:
    """The picker's text of an artifact: "name — id"."""
    return f"{artifact_name(art)}{SEP}{art.id}"


def artifact_tip(art: Artifact) -> str:
    """The tooltip: id, when it was made, the whole summary."""
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(art.created))
    summary = printable(art.summary)
    return f"{art.id} (made {made})" + (f"\n{summary}" if summary else "")


class ArtifactCombo(QtWidgets.QComboBox):
    """Artifacts of one kind, newest first; see the module docstring for the selection."""

    def __init__(
        self, parent: QtWidgets.QWidget | None = None, min_chars: int = 20, what: str = ""
    ) -> None:
        super().__init__(parent)
        self.what = what  # what the choice is for: the tooltip's first line
        self.setSizeAdjustPolicy(
            QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.setMinimumContentsLength(min_chars)
        self._pick: str | None = None  # the artifact someone chose
        self._filling = False
        self._placeholder = False
        self.currentIndexChanged.connect(self._chosen)
        self._update_tip()

    # -- filling ---------------------------------------------------------------------------
    def ids(self) -> list[str]:
        """The listed artifact ids, top to bottom (newest first)."""
        start = 1 if self._placeholder else 0
        return [self.itemData(i) for i in range(start, self.count())]

    def set_artifacts(self, arts: Sequence[Artifact], placeholder: str | None = None) -> bool:
        """List `arts` (given oldest first) newest first and select as the module says.
        True when the chosen artifact changed."""
        newest_first = list(reversed(arts))
        before = self.currentData()
        same_rows = self.ids() == [a.id for a in newest_first] and self._placeholder == (
            placeholder is not None
        )
        self._filling = True
        blocked = self.blockSignals(True)
        try:
            if placeholder is not None and same_rows:
                self.setItemText(0, placeholder)
            if not same_rows:
                self.clear()
                self._placeholder = placeholder is not None
                if placeholder is not None:
                    self.addItem(placeholder, None)
                for a in newest_first:
                    self.addItem(artifact_text(a), a.id)
                    self.setItemData(
                        self.count() - 1, artifact_tip(a), QtCore.Qt.ItemDataRole.ToolTipRole
                    )
                self._fit_popup()
            idx = self.findData(self._pick) if self._pick is not None else -1
            self.setCurrentIndex(idx if idx >= 0 else 0 if self.count() else -1)
        finally:
            self.blockSignals(blocked)
        try:
            changed = self.currentData() != before
            if changed:
                self.currentIndexChanged.emit(self.currentIndex())
        finally:
            self._filling = False
        self._update_tip()
        return changed

    def select(self, artifact_id: str | None) -> bool:
        """Choose `artifact_id` (as a user would); False when it is not listed. None forgets
        the choice: the placeholder, or else the newest, is selected."""
        if artifact_id is None:
            self._pick = None
            self._filling = True
            try:
                self.setCurrentIndex(0 if self.count() else -1)
            finally:
                self._filling = False
            return True
        idx = self.findData(artifact_id)
        if idx < 0:
            return False
        self._pick = artifact_id
        self.setCurrentIndex(idx)
        return True

    def _chosen(self, index: int) -> None:
        if not self._filling and index >= 0:
            self._pick = self.itemData(index)
        self._update_tip()

    def _update_tip(self) -> None:
        tip = self.itemData(self.currentIndex(), QtCore.Qt.ItemDataRole.ToolTipRole)
        self.setToolTip("\n\n".join(t for t in (self.what, str(tip or "")) if t))

    def _fit_popup(self) -> None:
        """The drop-down list as wide as its longest row (the box itself stays narrow)."""
        fm = self.view().fontMetrics()
        widest = max(
            (fm.horizontalAdvance(self.itemText(i)) for i in range(self.count())), default=0
        )
        self.view().setMinimumWidth(widest + 40)

    # -- drawing ---------------------------------------------------------------------------
    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt name)
        """The chosen row's text loses its middle to "…" when the box is narrower than it:
        the start of the name and the end of the id (its unique part) stay in view."""
        painter = QtWidgets.QStylePainter(self)
        opt = QtWidgets.QStyleOptionComboBox()
        self.initStyleOption(opt)
        painter.drawComplexControl(QtWidgets.QStyle.ComplexControl.CC_ComboBox, opt)
        room = self.style().subControlRect(
            QtWidgets.QStyle.ComplexControl.CC_ComboBox,
            opt,
            QtWidgets.QStyle.SubControl.SC_ComboBoxEditField,
            self,
        )
        opt.currentText = self.fontMetrics().elidedText(
            opt.currentText, QtCore.Qt.TextElideMode.ElideMiddle, max(0, room.width() - 4)
        )
        painter.drawControl(QtWidgets.QStyle.ControlElement.CE_ComboBoxLabel, opt)
