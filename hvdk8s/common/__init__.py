"""The neutral helpers every layer uses, without TensorFlow: ``atomic`` (the one atomic file and folder writer),
``files`` (reading the files users name, errors that name the file; YAML in and out), ``fields`` (Kubernetes' name,
label and quantity rules, field errors and the path every validator reports under), ``errors`` (``UserError``),
``quiet`` (TensorFlow's start-up lines off) and ``figures`` (report figures, saved atomically). They import nothing
from hvdk8s outside this package."""
