"""Preflight for a workshop laptop: ``python -m tokenflow.check`` (``--lang zh`` for Chinese).

Answers in a few seconds whether this Python environment can run the book's notebooks, one line
per check and, for each problem, what to do about it:

- Python: the version is in the range the package declares (``Requires-Python``);
- torch: installed, its version (against requirements.txt's pin when run from a checkout), and
  whether it is the CPU or the CUDA build (the CUDA build works but costs gigabytes);
- font: the font bundled in ``tokenflow/data/fonts/`` is there, matplotlib finds it by name,
  and it draws 都 (the figures' Chinese labels);
- JupyterLab and the ipywidgets extension (``jupyterlab_widgets``, installed where JupyterLab
  looks for extensions), so the live explorers draw;
- the running example: the bundled model, greedy after 北京是中国的首, predicts 都.

Exit status 0 when nothing failed (warnings allowed), 1 otherwise. Each check is a function
returning a :class:`Result`; :func:`run_checks` runs them all and never raises.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Result", "run_checks", "main", "FONT_DIR", "PROMPT", "EXPECTED"]

PACKAGE_DIR = Path(__file__).resolve().parent
FONT_DIR = PACKAGE_DIR / "data" / "fonts"
"""Where the bundled font lives (``*.ttf`` / ``*.otf``); $TOKENFLOW_FONT_DIR overrides it."""
PROMPT = "北京是中国的首"
EXPECTED = "都"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

OK, WARN, FAIL = "ok", "warn", "FAIL"

# Every message, in English and Chinese; {name} fields are filled by the checks.
MESSAGES = {
    "en": {
        "python": "Python {version}",
        "python.bad": "Python {version} is outside the supported range {spec}",
        "python.bad.fix": "install Python 3.11, 3.12 or 3.13 (tested) and recreate .venv with it",
        "python.new": "Python {version}: newer than the tested {tested}",
        "python.new.fix": "it should work; if a package fails to install, use Python {tested}",
        "torch": "torch {version}, {build} build",
        "torch.missing": "torch is not installed ({error})",
        "torch.missing.fix": "pip install -r requirements.txt (on Linux first: pip install "
                             "--index-url " + CPU_INDEX + " torch=={pin})",
        "torch.pin": "torch {version} installed, requirements.txt pins {pin}",
        "torch.pin.fix": "pip install --index-url " + CPU_INDEX + " torch=={pin}",
        "torch.cuda": "torch {version} is the CUDA build (CUDA {cuda}): it works, but takes "
                      "several GB",
        "torch.cuda.fix": "to save the space: pip uninstall torch, then pip install "
                          "--index-url " + CPU_INDEX + " torch=={pin}",
        "cpu": "CPU",
        "font": "font {family} ({file}) found by matplotlib, draws " + EXPECTED,
        "font.missing": "bundled font missing: no .ttf/.otf in {dir}",
        "font.missing.fix": "update your checkout (git pull) and reinstall: pip install -e . ; "
                            "without it the figures draw boxes instead of Chinese",
        "font.unfound": "font file {file} is there, but matplotlib does not resolve "
                        "'{family}' to it ({error})",
        "font.unfound.fix": "delete matplotlib's font cache (python -c \"import matplotlib; "
                            "print(matplotlib.get_cachedir())\") and run this check again",
        "font.noglyph": "font {family} ({file}) has no glyph for " + EXPECTED,
        "font.noglyph.fix": "the bundled font is damaged: git checkout -- src/tokenflow/data/fonts",
        "font.damaged": "bundled font file missing or damaged: {error}",
        "font.damaged.fix": "restore it: git checkout -- src/tokenflow/data/fonts, then "
                            "pip install -e .",
        "lab": "JupyterLab {lab}, ipywidgets {ipw}, widget extension {ext}",
        "lab.missing": "{what} is not installed",
        "lab.missing.fix": "pip install -r requirements.txt",
        "lab.noext": "the ipywidgets extension is installed ({ext}) but JupyterLab does not see "
                     "it (no {rel} under {paths})",
        "lab.noext.fix": "install jupyterlab and jupyterlab_widgets into the same environment, "
                         "then run jupyter lab from it (python -m jupyter lab)",
        "webfont": "the notebooks' web fonts draw " + EXPECTED + " and the emoji in JupyterLab "
                   "({css})",
        "webfont.damaged": "web font {file} missing or without its glyphs: {error}",
        "webfont.damaged.fix": "git checkout -- src/tokenflow/data/fonts",
        "webfont.nocss": "JupyterLab has no book font stylesheet: without a Chinese system font "
                         "the notebooks show boxes for Chinese characters",
        "webfont.nocss.fix": "start JupyterLab with make lab, or: python -m tokenflow.viz.fonts "
                             "--lab-css {css} ; python -m jupyter lab --custom-css notebooks",
        "example": "running example: after " + PROMPT + " the model predicts {token} "
                   "({seconds:.1f} s)",
        "example.bad": "running example: after " + PROMPT + " the model predicts {token!r}, "
                       "not " + EXPECTED,
        "example.bad.fix": "the package or its weights differ from the book's: git status; "
                           "pip install -e .",
        "example.error": "running example failed: {error}",
        "example.error.fix": "fix the lines above first; then pip install -e .",
        "skipped": "skipped: needs torch",
        "summary.ok": "ready: {n} checks passed ({warn} warnings) in {seconds:.1f} s",
        "summary.fail": "not ready: {fail} of {n} checks failed; fix the lines marked FAIL",
        "fix": "fix",
    },
    "zh": {
        "python": "Python {version}",
        "python.bad": "Python {version} 不在支持的范围 {spec} 内",
        "python.bad.fix": "安装 Python 3.11、3.12 或 3.13（已测试），并用它重新创建 .venv",
        "python.new": "Python {version}：比已测试的 {tested} 更新",
        "python.new.fix": "应该可以运行；若有包装不上，请改用 Python {tested}",
        "torch": "torch {version}，{build} 版本",
        "torch.missing": "没有安装 torch（{error}）",
        "torch.missing.fix": "pip install -r requirements.txt（Linux 上先运行：pip install "
                             "--index-url " + CPU_INDEX + " torch=={pin}）",
        "torch.pin": "已安装 torch {version}，requirements.txt 固定的是 {pin}",
        "torch.pin.fix": "pip install --index-url " + CPU_INDEX + " torch=={pin}",
        "torch.cuda": "torch {version} 是 CUDA 版本（CUDA {cuda}）：能用，但占用数 GB 空间",
        "torch.cuda.fix": "若要节省空间：pip uninstall torch，然后 pip install "
                          "--index-url " + CPU_INDEX + " torch=={pin}",
        "cpu": "CPU",
        "font": "matplotlib 找到了字体 {family}（{file}），能显示“" + EXPECTED + "”",
        "font.missing": "缺少随书字体：{dir} 中没有 .ttf/.otf 文件",
        "font.missing.fix": "更新代码（git pull）并重新安装：pip install -e . ；"
                            "没有它，图中的中文会显示成方框",
        "font.unfound": "字体文件 {file} 存在，但 matplotlib 没有把“{family}”解析到它（{error}）",
        "font.unfound.fix": "删除 matplotlib 的字体缓存（python -c \"import matplotlib; "
                            "print(matplotlib.get_cachedir())\"），再运行一次本检查",
        "font.noglyph": "字体 {family}（{file}）中没有“" + EXPECTED + "”字",
        "font.noglyph.fix": "随书字体已损坏：git checkout -- src/tokenflow/data/fonts",
        "font.damaged": "随书字体文件缺失或已损坏：{error}",
        "font.damaged.fix": "恢复它：git checkout -- src/tokenflow/data/fonts，"
                            "再运行 pip install -e .",
        "lab": "JupyterLab {lab}，ipywidgets {ipw}，控件扩展 {ext}",
        "lab.missing": "没有安装 {what}",
        "lab.missing.fix": "pip install -r requirements.txt",
        "lab.noext": "ipywidgets 扩展已安装（{ext}），"
                     "但 JupyterLab 看不到它（{paths} 下没有 {rel}）",
        "lab.noext.fix": "把 jupyterlab 和 jupyterlab_widgets 装进同一个环境，"
                         "并从该环境启动：python -m jupyter lab",
        "webfont": "笔记本的网页字体能在 JupyterLab 中显示“" + EXPECTED + "”和表情符号（{css}）",
        "webfont.damaged": "网页字体 {file} 缺失或缺少字形：{error}",
        "webfont.damaged.fix": "git checkout -- src/tokenflow/data/fonts",
        "webfont.nocss": "JupyterLab 没有随书字体样式表：没有中文系统字体时，"
                         "笔记本里的汉字会显示成方框",
        "webfont.nocss.fix": "用 make lab 启动 JupyterLab，或者：python -m tokenflow.viz.fonts "
                             "--lab-css {css} ；python -m jupyter lab --custom-css notebooks",
        "example": "贯穿全书的例子：" + PROMPT + " 之后模型预测“{token}”（{seconds:.1f} 秒）",
        "example.bad": "贯穿全书的例子：" + PROMPT + " 之后模型预测 {token!r}，而不是“"
                       + EXPECTED + "”",
        "example.bad.fix": "代码包或权重与书中的不同：git status；pip install -e .",
        "example.error": "运行例子失败：{error}",
        "example.error.fix": "先解决上面的问题，然后 pip install -e .",
        "skipped": "已跳过：需要 torch",
        "summary.ok": "准备就绪：{n} 项检查通过（{warn} 个警告），用时 {seconds:.1f} 秒",
        "summary.fail": "尚未就绪：{n} 项检查中有 {fail} 项失败；请按标有 FAIL 的行修复",
        "fix": "修复",
    },
}
LABELS = {"en": {"python": "python", "torch": "torch", "font": "font", "lab": "jupyterlab",
                 "webfont": "web font", "example": "example"},
          "zh": {"python": "Python", "torch": "torch", "font": "字体", "lab": "JupyterLab",
                 "webfont": "网页字体", "example": "例子"}}


@dataclass
class Result:
    """One check's outcome: ``status`` is ``"ok"``, ``"warn"`` or ``"FAIL"``; ``key`` names the
    message in :data:`MESSAGES` (``key + ".fix"`` is the advice), ``args`` fills it."""
    name: str
    status: str
    key: str
    args: dict = field(default_factory=dict)
    fix: bool = False

    def lines(self, lang: str = "en") -> list[str]:
        """The check as printed: one line, plus an indented "fix:" line when there is advice."""
        msg = MESSAGES[lang]
        label = LABELS[lang][self.name]
        pad = " " * max(1, 11 - _width(label))
        out = [f"[{self.status:<4}] {label}{pad}{msg[self.key].format(**self.args)}"]
        if self.fix and f"{self.key}.fix" in msg:
            out.append(f"{'':18}{msg['fix']}: {msg[self.key + '.fix'].format(**self.args)}")
        return out


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal (East Asian wide characters take two)."""
    import unicodedata
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _torch_pin() -> str:
    """torch's version pinned in requirements.txt of a checkout next to this package, else the
    installed version's own (nothing to compare)."""
    req = PACKAGE_DIR.parents[1] / "requirements.txt"
    if req.exists():
        for line in req.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith("torch=="):
                return line.split("==", 1)[1].split()[0]
    return ""


def check_python() -> Result:
    """The running Python against the package's ``Requires-Python`` (a FAIL outside it) and
    the newest tested minor version, 3.13 (a warning above it; 3.11 to 3.13 are tested)."""
    from packaging.specifiers import SpecifierSet
    version = ".".join(map(str, sys.version_info[:3]))
    try:
        spec = md.metadata("tokenflow").get("Requires-Python") or ">=3.11"
    except md.PackageNotFoundError:
        spec = ">=3.11"
    tested = os.environ.get("TOKENFLOW_TESTED_PYTHON", "3.13")   # the Makefile's newest
    if version not in SpecifierSet(spec):
        return Result("python", FAIL, "python.bad", dict(version=version, spec=spec), fix=True)
    if sys.version_info[:2] > tuple(int(x) for x in tested.split(".")):
        return Result("python", WARN, "python.new", dict(version=version, tested=tested),
                      fix=True)
    return Result("python", OK, "python", dict(version=version))


def check_torch() -> Result:
    """torch importable, its version against the pin, and CPU or CUDA build (CUDA: warning)."""
    pin = _torch_pin()
    try:
        torch = importlib.import_module("torch")
        torch.__version__, torch.float32, torch.version     # an empty or shadowing module fails
    except Exception as exc:      # ImportError, or a broken install raising anything else
        return Result("torch", FAIL, "torch.missing",
                      dict(error=f"{type(exc).__name__}: {exc}", pin=pin or "2.13.0"), fix=True)
    version = torch.__version__.split("+")[0]
    if pin and version != pin:
        return Result("torch", WARN, "torch.pin", dict(version=torch.__version__, pin=pin),
                      fix=True)
    cuda = getattr(torch.version, "cuda", None)
    if cuda:
        return Result("torch", WARN, "torch.cuda",
                      dict(version=torch.__version__, cuda=cuda, pin=pin or version), fix=True)
    return Result("torch", OK, "torch", dict(version=torch.__version__, build="CPU"))


def font_files(font_dir: Path | None = None) -> list[Path]:
    """The bundled font files (``*.ttf``, ``*.otf``, ``*.ttc``) in ``font_dir`` (default
    :data:`FONT_DIR`, or $TOKENFLOW_FONT_DIR), regular before bold, fallback last; [] when the
    folder is missing."""
    d = Path(font_dir or os.environ.get("TOKENFLOW_FONT_DIR") or FONT_DIR)
    if not d.is_dir():
        return []
    # regular before bold, the main family before its fallback: the file matplotlib resolves
    # the family name to at normal weight comes first
    return sorted((p for p in d.iterdir() if p.suffix.lower() in (".ttf", ".otf", ".ttc")),
                  key=lambda p: ("fallback" in p.name.lower(), "bold" in p.name.lower(), p.name))


def check_font(font_dir: Path | None = None) -> Result:
    """The bundled font: present, every file readable by FreeType (a missing or damaged file of
    the set is a FAIL line, never a traceback), resolved by matplotlib's font manager by its
    family name (after ``addfont``, as the package registers it), and holding a glyph for 都."""
    files = font_files(font_dir)
    shown = Path(font_dir or os.environ.get("TOKENFLOW_FONT_DIR") or FONT_DIR)
    if not files:
        return Result("font", FAIL, "font.missing", dict(dir=shown), fix=True)
    path = files[0]
    family = path.stem
    try:
        # the package's own registration (tokenflow.viz.fonts; it needs torch, so only when
        # torch works) raises on a missing or damaged file of the set
        if check_torch().status != FAIL:
            importlib.import_module("tokenflow.viz.fonts")
        from matplotlib.ft2font import FT2Font
        for f in files:
            FT2Font(str(f))                    # FreeType opens every file of the set
    except Exception as exc:
        return Result("font", FAIL, "font.damaged", dict(error=exc), fix=True)
    from matplotlib import font_manager
    try:
        font_manager.fontManager.addfont(str(path))
        family = font_manager.FontProperties(fname=str(path)).get_name()
        found = font_manager.findfont(font_manager.FontProperties(family=family),
                                      fallback_to_default=False)
        if Path(found).resolve() != path.resolve() and Path(found).name != path.name:
            raise ValueError(f"resolves to {found}")
    except Exception as exc:
        return Result("font", FAIL, "font.unfound",
                      dict(file=path.name, family=family, error=exc), fix=True)
    if FT2Font(str(path)).get_char_index(ord(EXPECTED)) == 0:
        return Result("font", FAIL, "font.noglyph", dict(file=path.name, family=family),
                      fix=True)
    return Result("font", OK, "font", dict(file=path.name, family=family))


def check_lab() -> Result:
    """JupyterLab, ipywidgets and the widget extension installed, and the extension's
    ``@jupyter-widgets/jupyterlab-manager`` folder on JupyterLab's extension path."""
    versions = {}
    for key, dist in (("lab", "jupyterlab"), ("ipw", "ipywidgets"), ("ext", "jupyterlab_widgets")):
        try:
            versions[key] = md.version(dist)
        except md.PackageNotFoundError:
            return Result("lab", FAIL, "lab.missing", dict(what=dist), fix=True)
    from jupyter_core.paths import jupyter_path
    rel = "@jupyter-widgets/jupyterlab-manager"
    paths = jupyter_path("labextensions")
    if not any((Path(p) / rel / "package.json").exists() for p in paths):
        return Result("lab", FAIL, "lab.noext",
                      dict(ext=versions["ext"], rel=rel, paths=", ".join(paths[:3])), fix=True)
    return Result("lab", OK, "lab", versions)


WEB_FONT_GLYPHS = {"TokenflowCJK-zh.woff2": EXPECTED, "TokenflowEmoji.woff2": "\U0001F642"}
"""A character each web font of :data:`FONT_DIR` must draw (tokenflow.viz.fonts.WEB_FONTS)."""


def lab_css_paths() -> list[Path]:
    """Where JupyterLab's ``--custom-css`` looks for the book's stylesheet: ``make lab``'s config
    folder (``_build/jupyter-config``, when run from a checkout) and the user's Jupyter config
    folder."""
    from jupyter_core.paths import jupyter_config_dir
    paths = [PACKAGE_DIR.parents[1] / "_build" / "jupyter-config" / "custom" / "custom.css"]
    return paths + [Path(jupyter_config_dir()) / "custom" / "custom.css"]


def check_web_font(font_dir: Path | None = None) -> Result:
    """What a notebook in JupyterLab draws Chinese and emoji with on a machine without such
    system fonts: the web fonts (each holds its glyph of :data:`WEB_FONT_GLYPHS`) and a
    JupyterLab ``custom.css`` declaring them (written by ``make lab``, or
    ``python -m tokenflow.viz.fonts --lab-css PATH``); without the stylesheet a WARN."""
    d = Path(font_dir or FONT_DIR)
    for name, char in WEB_FONT_GLYPHS.items():
        try:
            from fontTools.ttLib import TTFont
            if ord(char) not in TTFont(str(d / name)).getBestCmap():
                raise ValueError(f"no glyph for {char}")
        except Exception as exc:
            return Result("webfont", FAIL, "webfont.damaged",
                          dict(file=d / name, error=f"{type(exc).__name__}: {exc}"), fix=True)
    paths = lab_css_paths()
    for css in paths:
        if css.is_file() and "Tokenflow CJK" in css.read_text(encoding="utf-8", errors="replace"):
            return Result("webfont", OK, "webfont", dict(css=css))
    return Result("webfont", WARN, "webfont.nocss", dict(css=paths[-1]), fix=True)


def check_example() -> Result:
    """load_pretrained(), one forward pass over 北京是中国的首, greedy last position: 都."""
    start = time.perf_counter()
    try:
        import torch
        from tokenflow.interop import load_pretrained
        model, tok = load_pretrained()
        with torch.inference_mode():
            logits = model(torch.tensor([tok.encode(PROMPT)]))       # [1, S, V]
        token = tok.id_to_token(int(logits[0, -1].argmax()))
    except Exception as exc:
        return Result("example", FAIL, "example.error", dict(error=f"{type(exc).__name__}: "
                                                              f"{exc}"), fix=True)
    if token != EXPECTED:
        return Result("example", FAIL, "example.bad", dict(token=token), fix=True)
    return Result("example", OK, "example",
                  dict(token=token, seconds=time.perf_counter() - start))


def run_checks() -> list[Result]:
    """Every check, in order; the running example is skipped (a FAIL) when torch failed."""
    results = [check_python(), check_torch(), check_font(), check_lab(), check_web_font()]
    if results[1].status == FAIL:
        results.append(Result("example", FAIL, "skipped"))
    else:
        results.append(check_example())
    return results


def main(argv: list[str] | None = None) -> int:
    """Print one line per check (and what to fix), then a summary; 0 if nothing failed."""
    ap = argparse.ArgumentParser(prog="python -m tokenflow.check",
                                 description="Is this laptop ready for the tokenflow workshop?")
    ap.add_argument("--lang", choices=sorted(MESSAGES), default="en",
                    help="language of the report (en or zh)")
    args = ap.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):        # Windows consoles: print Chinese, not '?'
        try:
            sys.stdout.reconfigure(encoding="utf-8")
        except (ValueError, OSError):
            pass
    start = time.perf_counter()
    results = run_checks()
    for r in results:
        for line in r.lines(args.lang):
            print(line)
    fail = sum(r.status == FAIL for r in results)
    warn = sum(r.status == WARN for r in results)
    msg = MESSAGES[args.lang]
    if fail:
        print(msg["summary.fail"].format(fail=fail, n=len(results)))
    else:
        print(msg["summary.ok"].format(n=len(results), warn=warn,
                                       seconds=time.perf_counter() - start))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
