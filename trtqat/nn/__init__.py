"""pytorch-quantization's ``nn`` namespace: TensorQuantizer, Clip and the Quant* layers.

As in pytorch-quantization, every public name of the layer modules (each one's ``__all__``,
where the name is listed once) is re-exported here.
"""

from trtqat.nn import functional  # noqa: F401  (re-exported)
from trtqat.nn.modules.clip import *  # noqa: F403
from trtqat.nn.modules.quant_conv import *  # noqa: F403
from trtqat.nn.modules.quant_instancenorm import *  # noqa: F403
from trtqat.nn.modules.quant_linear import *  # noqa: F403
from trtqat.nn.modules.quant_pooling import *  # noqa: F403
from trtqat.nn.modules.quant_rnn import *  # noqa: F403
from trtqat.nn.modules.tensor_quantizer import *  # noqa: F403

# the names above and `functional` (`modules` is the subpackage, not a name of this namespace)
__all__ = sorted(name for name in dict(globals()) if not name.startswith("_") and name != "modules")
